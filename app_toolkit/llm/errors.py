"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``, with the
status codes OpenAI's clients map to their exception classes (400 ``BadRequestError``,
404 ``NotFoundError``, 503 ``InternalServerError`` after retries)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypedDict

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from app_toolkit.exceptions import APIKeyRefused, BackPressureError, ReplicaUnavailableError
from app_toolkit.streaming import OpenAIErrorEvent


class OpenAIError(Exception):
    """An error the client caused or should hear about, answered in OpenAI's shape.

    Raised in a model's replica it crosses to the ingress with every argument (pickled),
    and is answered there as it would have been in the ingress itself.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, message, type_, code, param, retry_after)  # all args survive pickling
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param
        #: Seconds after which a retry may succeed (a 429's limit window): the answer's
        #: ``Retry-After``, in whole seconds, at least 1. A 503 without it says 1.
        self.retry_after = retry_after

    def __str__(self) -> str:
        return self.message

    @property
    def status_code(self) -> int:
        """The toolkit logs a raised 4xx as the caller's mistake: one line, no traceback."""
        return self.status

    def body(self) -> dict[str, dict[str, str | int | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def event(self) -> OpenAIErrorEvent:
        """This error as the last event of a stream cut off by it."""
        return OpenAIErrorEvent(self.message, self.code, self.type, self.param)


def bad_parameter(param: str, message: str, code: str = "invalid_value") -> OpenAIError:
    """The 400 for one request parameter, named."""
    return OpenAIError(400, message, "invalid_request_error", code, param)


def unknown_model(model: str, served: Sequence[str]) -> OpenAIError:
    """The 404 OpenAI answers for a model it does not serve."""
    names = ", ".join(repr(name) for name in served)
    return OpenAIError(
        404,
        f"The model {model!r} does not exist; this server has {names}.",
        "invalid_request_error",
        "model_not_found",
        "model",
    )


#: What a model call may raise that the client should hear about as such.
ANSWERED = (OpenAIError, BackPressureError, ReplicaUnavailableError)


def as_openai_error(exc: BaseException) -> OpenAIError:
    """The answer for one of the :data:`ANSWERED` exceptions."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, BackPressureError):  # the deployment's backpressure_config: status, Retry-After
        code = "rate_limit_exceeded" if exc.status_code == 429 else "overloaded"
        kind = "rate_limit_error" if exc.status_code == 429 else "server_error"
        return OpenAIError(
            exc.status_code, "The model is busy; retry shortly.", kind, code, None, exc.retry_after_s
        )
    return OpenAIError(503, "The model replica went away; retry.", "server_error", "unavailable")


def stream_error(exc: BaseException) -> OpenAIErrorEvent:
    """What ends a stream cut off mid-way by one of the :data:`ANSWERED` exceptions; a
    model replica that went away (or whose engine stopped: ``EngineStopped``) is the
    restart error (retry)."""
    if isinstance(exc, ReplicaUnavailableError):
        return OpenAIErrorEvent.restarting()
    return as_openai_error(exc).event()


class InvalidField(TypedDict):
    """A field at fault, as :func:`invalid_request` reads it of pydantic's errors (their
    ``ErrorDetails`` have these keys and more)."""

    loc: tuple[int | str, ...]
    msg: str


def invalid_request(errors: Sequence[InvalidField]) -> OpenAIError:
    """The 400 for a request that failed validation (pydantic's error list); ``param``
    names the first field at fault (``messages[0].content``)."""
    places = [_param(error["loc"]) for error in errors]
    problems = "; ".join(f"{place}: {error['msg']}" for place, error in zip(places, errors, strict=True))
    return OpenAIError(
        400,
        f"Invalid request: {problems}",
        "invalid_request_error",
        "invalid_request",
        places[0] if places else None,
    )


def _param(location: Sequence[int | str]) -> str:
    param = ""
    for part in location:
        if part == "body":
            continue
        param += f"[{part}]" if isinstance(part, int) else f".{part}" if param else str(part)
    return param


def answer(error: OpenAIError, given: Mapping[str, str] | None = None) -> JSONResponse:
    """The JSON response for ``error``; a 503, or an error that knows, says when to retry.
    ``given``: headers the error came with (an ``HTTPException``'s, as FastAPI keeps them)."""
    headers = retry_headers(error) or {}
    if error.status == 401:  # a missing or wrong API key (RFC 9110: a 401 names its scheme)
        headers["WWW-Authenticate"] = "Bearer"
    headers.update(given or {})
    return JSONResponse(error.body(), status_code=error.status, headers=headers or None)


def retry_headers(error: OpenAIError) -> dict[str, str] | None:
    """``Retry-After`` for ``error``: its ``retry_after`` in whole seconds (at least 1), else
    1 for a 503; None when a retry would not help."""
    if error.retry_after is not None:
        return {"Retry-After": str(max(1, math.ceil(error.retry_after)))}
    return {"Retry-After": "1"} if error.status == 503 else None


def install(app: FastAPI) -> None:
    """Answer validation errors, HTTP errors and :class:`OpenAIError` in OpenAI's shape."""

    async def openai_error(request: Request, exc: Exception) -> JSONResponse:
        return answer(as_openai_error(exc))

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return answer(invalid_request(exc.errors()))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        if isinstance(exc, APIKeyRefused):  # the front's own answer (admit_key)
            return JSONResponse({"error": exc.error}, status_code=exc.status_code, headers=exc.headers)
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return answer(OpenAIError(exc.status_code, str(exc.detail), kind), exc.headers)

    for answered in ANSWERED:
        app.add_exception_handler(answered, openai_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
