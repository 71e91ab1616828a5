"""Every error the API answers with, in OpenAI's shape: ``{"error": {"message", "type", "code"}}``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import app_toolkit as tk
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .schemas import ChatError

RETRY_AFTER_S = 1


def overloaded() -> ChatError:
    return ChatError(503, "The model is busy; retry shortly.", "server_error", "overloaded")


#: What a model or reply call may raise that the client should hear about as such.
ANSWERED = (ChatError, tk.BackPressureError, tk.ReplicaUnavailableError)


def as_chat_error(exc: ChatError | tk.BackPressureError | tk.ReplicaUnavailableError) -> ChatError:
    """The answer for one of the :data:`ANSWERED` exceptions."""
    if isinstance(exc, ChatError):
        return exc
    if isinstance(exc, tk.BackPressureError):
        return overloaded()
    return ChatError(503, "The model replica went away; retry.", "server_error", "unavailable")


def stream_error(exc: ChatError | tk.BackPressureError | tk.ReplicaUnavailableError) -> tk.OpenAIErrorEvent:
    """What ends a stream cut off mid-way by one of the :data:`ANSWERED` exceptions; the
    model replica going away (it restarted, or was lost) is the restart error: retry."""
    if isinstance(exc, tk.ReplicaUnavailableError):
        return tk.OpenAIErrorEvent.restarting()
    error = as_chat_error(exc)
    return tk.OpenAIErrorEvent(error.message, error.code, error.type, error.param)


def invalid_request(errors: Sequence[Any]) -> ChatError:
    """The 400 for a request that failed validation (pydantic's error list); ``param``
    names the first field at fault (``messages[0].content``)."""
    places = [_param(error["loc"]) for error in errors]
    problems = "; ".join(f"{place}: {error['msg']}" for place, error in zip(places, errors, strict=True))
    return ChatError(
        400,
        f"Invalid request: {problems}",
        "invalid_request_error",
        "invalid_request",
        places[0] if places else None,
    )


def _param(location: Sequence[Any]) -> str:
    param = ""
    for part in location:
        if part == "body":
            continue
        param += f"[{part}]" if isinstance(part, int) else f".{part}" if param else str(part)
    return param


def answer(error: ChatError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=retry_headers(error))


def retry_headers(error: ChatError) -> dict[str, str] | None:
    """``Retry-After`` (whole seconds, at least 1) for a 429 or 503 answer."""
    if error.retry_after is not None:
        return {"Retry-After": str(max(1, math.ceil(error.retry_after)))}
    return {"Retry-After": str(RETRY_AFTER_S)} if error.status == 503 else None


def install(app: FastAPI) -> None:
    """Answer validation errors, HTTP errors and ChatErrors in OpenAI's shape."""

    async def chat_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ChatError)
        return answer(exc)

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return answer(invalid_request(exc.errors()))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return answer(ChatError(exc.status_code, str(exc.detail), kind))

    app.add_exception_handler(ChatError, chat_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
