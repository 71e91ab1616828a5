"""A streamed handle call on its caller's side (``DeploymentResponseGenerator`` reads it):
its exchange and replica slot, ended once, and for a continuable method the call that
continues it on another replica when its own is lost (``continuations.py`` keeps the
items and the rules' state)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from app_toolkit._runtime import tracing
from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.messages import (
    CallFailure,
    DeploymentID,
    MethodCall,
    ReplicaLost,
    StreamContinuation,
    StreamEnd,
    StreamItem,
)
from app_toolkit._runtime.routing.continuations import Continuation, sent_within
from app_toolkit._runtime.routing.data_plane import DataPlane
from app_toolkit._runtime.routing.replica_client import Reply
from app_toolkit._runtime.routing.replies import exception_of
from app_toolkit.exceptions import ReplicaUnavailableError

#: The call with its arguments resolved (responses passed as arguments awaited).
Resolve = Callable[[MethodCall], Awaitable[MethodCall]]


class StreamedCall:
    """One streamed call, on the data plane's loop: its exchange and replica slot, and for
    a continuable method (``@continuable``), what continues it when its replica is lost.
    ``resolve`` gives the call with the responses among its arguments awaited (the handle
    layer's chaining)."""

    __slots__ = (
        "_plane",
        "_resolve",
        "_deployment",
        "_call",
        "_reply",
        "_span",
        "_continuation",
        "_deadline",
        "_served_by",
        "_sending",
        "done",
        "__weakref__",
    )

    def __init__(
        self,
        plane: DataPlane,
        deployment: DeploymentID,
        call: MethodCall,
        resolve: Resolve,
        span: tracing.Span | None = None,
    ) -> None:
        self._plane = plane
        self._resolve = resolve
        self._deployment = deployment
        self._call = call
        self._reply: Reply | None = None
        self._span = span  # ended with the stream
        self._continuation: Continuation | None = None
        self._deadline = 0.0  # a continuation's: by when a replica must have taken it
        self._served_by: DeploymentID | None = None  # the deployment (a split's variant) serving it
        self._sending: asyncio.Task[Reply | None] | None = None  # a continuation on its way
        self.done = False

    async def next(self) -> object:
        if self.done:
            raise StopAsyncIteration
        while True:
            try:
                answer = await self._answer()
            except BaseException as exc:
                if self._continued_after(exc):
                    continue
                self.finish(type(exc).__name__)
                ending = self._ending(exc)
                if ending is exc:
                    raise
                raise ending from exc
            if isinstance(answer, StreamItem):
                if self._continuation is not None and self._reply is not None:
                    self._continuation.keep(answer.value, self._reply.exchange.received_cost)
                return answer.value
            error: BaseException | None = None
            if isinstance(answer, CallFailure):
                error = exception_of(answer)
            elif isinstance(answer, ReplicaLost) and self._reply is not None:
                error = self._reply.lost()  # as a unary call lost with its replica
            if error is not None and self._continued_after(error):
                continue
            self.finish("" if isinstance(answer, StreamEnd) else type(answer).__name__)
            if isinstance(answer, StreamEnd):
                raise StopAsyncIteration
            if error is not None:
                raise self._ending(error)
            raise ReplicaUnavailableError(
                f"Unexpected answer {type(answer).__name__} in the stream from {self._deployment}"
            )

    async def _answer(self) -> object:
        """The stream's next answer: the first one sends the call (or its continuation)."""
        if self._reply is not None:
            return await self._reply.exchange.recv()
        if self._continuation is None:
            self._plane.hold(self.finish)  # closing the data plane ends the stream
            call = await self._resolve(self._call)
            dispatcher = self._plane.dispatcher(self._deployment)
            reply = self._adopted(await dispatcher.send(call, call.model_id, call.shard_key))
            rule = self._rule()
            if rule is not None:
                self._continuation = Continuation(rule, self._deployment)
            return reply.first
        return await self._continued()

    async def _continued(self) -> object:
        """Send the continuation to the deployment that served the stream (not through a
        traffic split again; through it if none had answered): it waits for a replica (a
        lost one's replacement) to take it until its deadline, then the stream ends with
        its loss."""
        continuation = self._continuation
        assert continuation is not None
        served_by = self._served_by
        dispatcher = self._plane.dispatcher(served_by or self._deployment)
        call = await self._resolve(self._call)

        def send(on_open: Callable[[Exchange], None], on_refused: Callable[[], None]) -> Awaitable[Reply]:
            return dispatcher.send(
                call,
                call.model_id,
                call.shard_key,
                split=served_by is None,
                on_open=on_open,
                on_refused=on_refused,
            )

        wait_s = max(0.0, self._deadline - asyncio.get_running_loop().time())
        sending = self._sending = asyncio.ensure_future(sent_within(send, wait_s))
        try:
            reply = await sending
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self.done and (task is None or not task.cancelling()):
                raise StopAsyncIteration from None  # finished by cancel() or the plane closing
            raise
        finally:
            self._sending = None
        self._call = dataclasses.replace(self._call, continued=None)  # the items went with it
        if reply is None:
            continuation.end()
            assert continuation.loss is not None
            raise continuation.loss
        reply = self._adopted(reply)
        if isinstance(reply.first, StreamItem | StreamEnd):
            continuation.continued()
        return reply.first

    def _adopted(self, reply: Reply) -> Reply:
        """The stream's reply; given back at once if the stream ended while it was sent
        (cancelled, or the data plane closing)."""
        if self.done:
            reply.exchange.cancel()
            reply.release()
            raise StopAsyncIteration
        self._reply = reply
        self._served_by = reply.deployment or self._deployment
        return reply

    def _rule(self) -> StreamContinuation | None:
        """The method's continuation rules, as the deployment serving the stream says."""
        return self._plane.dispatcher(self._served_by or self._deployment).continuation(self._call.method)

    def _continued_after(self, error: BaseException) -> bool:
        """Whether the stream goes on after ``error``, its call sent again to continue it."""
        if self.done:
            return False
        continuation = self._continuation
        if continuation is None:  # lost before its first answer: its rules, if continuable
            rule = self._rule()
            if rule is None:
                return False
            continuation = self._continuation = Continuation(rule, self._deployment)
        call = continuation.after(error, self._call)
        if call is None:
            return False
        reply, self._reply = self._reply, None
        if reply is not None:
            reply.exchange.cancel()
            reply.release()
            # A replica that answered the stream with the error (its engine stopped) is
            # skipped a while; a lost one is forgotten already.
            self._plane.dispatcher(reply.deployment or self._deployment).suspect(reply.replica_id)
        self._call = call
        rule = self._rule()  # the newest table's (continuation_wait_s changes in place)
        wait_s = continuation.wait_s if rule is None else rule.wait_s
        self._deadline = asyncio.get_running_loop().time() + wait_s
        return True

    def _ending(self, error: BaseException) -> BaseException:
        """What a stream that ends with ``error`` raises: a continued stream that a replica
        could not continue, or that could not be sent on, ends with its loss."""
        continuation = self._continuation
        if continuation is None or continuation.loss is None or not continuation.refused(error):
            return error
        return continuation.loss

    def finish(self, error: str = "") -> None:
        """Stop the stream and give its replica slot back (on the data plane's loop)."""
        if self.done:
            return
        self.done = True
        if self._span is not None:
            self._span.end(error)
        self._plane.release(self.finish)
        if self._continuation is not None:
            self._continuation.release()
        if self._sending is not None:
            self._sending.cancel()  # a continuation on its way stops (its slot given back)
        if self._reply is not None:
            self._reply.exchange.cancel()
            self._reply.release()
