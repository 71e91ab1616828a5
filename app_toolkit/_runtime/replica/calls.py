"""Handle calls in a replica: finding the method a call names, running it (a value, or a
stream of items sent as they come) and the failure a caller gets when it raises."""

from __future__ import annotations

import inspect
import logging
import pickle
from collections.abc import AsyncIterable, Callable
from typing import cast

from app_toolkit._runtime.channel.frames import Dumps
from app_toolkit._runtime.channel.server import ResponseSink
from app_toolkit._runtime.continuation_marks import continue_from_of
from app_toolkit._runtime.messages import END, CallFailure, CallResult, MethodCall, StreamItem
from app_toolkit._runtime.replica.user_code import call_maybe_async, close_generator, iterate_in_thread
from app_toolkit.exceptions import MethodNotFoundError

logger = logging.getLogger("app_toolkit.replica")


def find_method(target: object, definition: object, name: str, deployment: str) -> Callable[..., object]:
    """The method of the user's object (``target``, built from ``definition``) that a call
    names; a function deployment's ``__call__`` is the function."""
    if name == "__call__" and not inspect.isclass(definition) and callable(target):
        return target
    if name.startswith("_") and name != "__call__":
        raise AttributeError(f"{deployment} does not expose private method {name!r}")
    method = getattr(target, name, None)
    if method is None or not callable(method):
        methods = [m for m in dir(target) if not m.startswith("__") and callable(getattr(target, m, None))]
        raise MethodNotFoundError(
            f"Tried to call a method '{name}' that does not exist. Available methods: {methods}."
        )
    return cast(Callable[..., object], method)


async def run_call(
    method: Callable[..., object], call: MethodCall, sink: ResponseSink, deployment: str
) -> None:
    """Run ``call`` on ``method`` and send its result (or, with ``stream``, its items)."""
    if call.stream:
        await _stream_call(method, call, sink, deployment)
        return
    result = await call_maybe_async(method, *call.args, **call.kwargs)
    if inspect.isgenerator(result) or inspect.isasyncgen(result):
        close_generator(result)
        raise TypeError(
            f"{deployment}.{call.method} is a generator; call it through "
            "handle.options(stream=True) to receive its items"
        )
    _send_value(sink, CallResult(result), call, deployment)


def client_error_status(exc: BaseException) -> int:
    """The status of an exception that says the caller erred: an int ``status_code`` from
    400 to 499 (FastAPI's ``HTTPException`` has one); 0 for any other exception."""
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) and 400 <= status < 500 else 0


def log_call_failure(exc: Exception, call: MethodCall, deployment: str) -> None:
    """Log a call that raised: the caller's mistake (a 4xx ``status_code``) in a line, any
    other failure with its traceback, both with the request id."""
    status = client_error_status(exc)
    if status:  # the caller's mistake, answered as such: no traceback to read
        logger.info(
            "Request %s: %s.%s refused it (%d): %s", call.request_id, deployment, call.method, status, exc
        )
    else:
        logger.exception("Request %s: %s.%s raised", call.request_id, deployment, call.method)


def failure(exc: Exception, dumps: Dumps) -> CallFailure:
    """What the caller gets for ``exc``: the exception itself when it pickles, else its
    type and message."""
    blob: bytes | None
    try:
        blob = dumps(exc)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001 - not picklable: the caller gets type and message
        blob = None
    return CallFailure(type(exc).__name__, str(exc), blob)


def _send_value(
    sink: ResponseSink, answer: CallResult | StreamItem, call: MethodCall, deployment: str
) -> None:
    """Send a result or stream item; one that cannot be serialized fails the call."""
    try:
        sink.send(answer)
    except Exception as exc:  # noqa: BLE001 - unpicklable: the caller must hear why
        raise TypeError(
            f"{deployment}.{call.method} returned a {type(answer.value).__name__}, which cannot be "
            f"sent to the caller ({exc}); return plain data or picklable objects"
        ) from None


async def _stream_call(
    method: Callable[..., object], call: MethodCall, sink: ResponseSink, deployment: str
) -> None:
    """Send each item a generator method yields as soon as it exists."""
    items: AsyncIterable[object]
    result = method(*_continued_args(method, call, deployment), **call.kwargs)
    if inspect.isgenerator(result):
        items = iterate_in_thread(result)
    else:  # an async generator, or anything returning (or awaiting to) an async iterator
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, AsyncIterable):
            raise TypeError(f"{deployment}.{call.method} is not a generator; call it without stream=True")
        items = result
    try:
        async for item in items:
            _send_value(sink, StreamItem(item), call, deployment)
            await sink.drain()
    finally:
        # Runs on cancellation too (the caller went away): the user's generator closes.
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()
    sink.send(END)


def _continued_args(method: Callable[..., object], call: MethodCall, deployment: str) -> tuple[object, ...]:
    """The call's arguments; for a continued stream (``call.continued``), its first made by
    the method's ``continue_from`` from it and the items its caller has already."""
    if call.continued is None:
        return call.args
    continue_from = continue_from_of(method)
    if continue_from is None or not call.args:
        raise TypeError(
            f"{deployment}.{call.method} was asked to continue a stream, but it is not @continuable "
            "or was called without a request to continue"
        )
    return (continue_from(call.args[0], call.continued), *call.args[1:])
