"""The OpenAI-compatible API (``/v1/models``, ``/v1/chat/completions``, ``/v1/responses``,
``/v1/usage``) and the same chat over a WebSocket (``/v1/chat/ws``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import app_toolkit as tk
from app_toolkit.llm.errors import ANSWERED, OpenAIError, as_openai_error, invalid_request, stream_error
from fastapi import APIRouter, Depends, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from . import responses_api
from .access import Guard, SocketAdmit
from .responses_api import ResponsesRequest
from .schemas import ChatCompletionRequest, Delta, Generation
from .settings import Settings

logger = logging.getLogger(__name__)

Reply = tk.DeploymentResponseGenerator[Delta]


async def open_reply(model: tk.DeploymentHandle, generation: Generation) -> tuple[Delta, Reply]:
    """Start a reply on the model pool; its first item (the prompt's size) is read here, so
    a refusal becomes an HTTP error before any response byte is sent."""
    stream: Reply = model.options(method_name="generate", stream=True).remote(generation)
    try:
        return await anext(stream), stream
    except ANSWERED as exc:
        stream.cancel()
        raise as_openai_error(exc) from None
    except BaseException:
        stream.cancel()
        raise


def build_router(settings: Settings, model_app: tk.Application, guard: Guard) -> APIRouter:
    router = APIRouter()
    model_name = settings.model_name

    def generation_of(request: ChatCompletionRequest | ResponsesRequest, owner: str) -> Generation:
        if request.model not in (None, "", model_name):
            raise OpenAIError(
                404,
                f"The model {request.model!r} does not exist; this server has {model_name!r}.",
                "invalid_request_error",
                "model_not_found",
                "model",
            )
        return dataclasses.replace(request.generation(settings), owner=owner)

    entry = {"id": model_name, "object": "model", "created": 0, "owned_by": "app_toolkit"}

    @router.get("/v1/models")
    async def models(owner: str = Depends(guard.caller)) -> dict[str, Any]:
        return {"object": "list", "data": [entry]}

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str, owner: str = Depends(guard.caller)) -> dict[str, Any]:
        if model_id != model_name:
            raise OpenAIError(
                404,
                f"The model {model_id!r} does not exist; this server has {model_name!r}.",
                "invalid_request_error",
                "model_not_found",
                "model",
            )
        return entry

    @router.post("/v1/chat/completions", response_model=None)
    async def completions(
        request: ChatCompletionRequest,
        owner: str = Depends(guard.admitted),
        model: tk.DeploymentHandle = tk.Depends(model_app),
    ) -> dict[str, Any] | tk.ChatCompletionStream | tk.EventStream:
        relayed = request.relayed(settings)
        if relayed is not None:  # tool calls, several choices…: the upstream answers it whole
            return await _relay(model, relayed, owner)
        first, stream = await open_reply(model, generation_of(request, owner))
        if request.stream:
            return _streamed(first, stream, model_name, request)
        text: list[str] = []
        last = first
        try:
            async for delta in stream:
                text.append(delta.text)
                last = delta
        finally:
            stream.cancel()  # a client that left early stops the model's work too
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(text)},
                    "finish_reason": last.finish_reason,
                }
            ],
            "usage": _usage(first.prompt_tokens, last.completion_tokens),
        }

    @router.post("/v1/responses", response_model=None)
    async def responses(
        request: ResponsesRequest,
        owner: str = Depends(guard.admitted),
        model: tk.DeploymentHandle = tk.Depends(model_app),
    ) -> dict[str, Any] | tk.EventStream:
        """OpenAI's Responses API: text input and output, plain or streamed."""
        first, stream = await open_reply(model, generation_of(request, owner))
        reply = responses_api.Reply(request, model_name, first.prompt_tokens)
        if request.stream:
            return responses_api.streamed(reply, stream, tk.get_request_id())
        return await responses_api.answer(reply, stream)

    @router.get("/v1/usage")
    async def usage(counts: dict[str, object] = Depends(guard.usage)) -> dict[str, object]:
        """The calling key's owner's requests and tokens so far, and its limits."""
        return counts

    @router.websocket("/v1/chat/ws")
    async def chat_socket(
        socket: WebSocket,
        admit: SocketAdmit = Depends(guard.socket_admitter),
        model: tk.DeploymentHandle = tk.Depends(model_app),
    ) -> None:
        await socket.accept()
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                message = await socket.receive_json()
                try:
                    request = ChatCompletionRequest.model_validate(message)
                    owner = await admit()  # each message is a request, under the key's limits
                    first, stream = await open_reply(model, generation_of(request, owner))
                except ValidationError as exc:
                    await socket.send_json(
                        {"type": "error", "error": invalid_request(exc.errors()).body()["error"]}
                    )
                    continue
                except OpenAIError as exc:
                    await socket.send_json({"type": "error", "error": exc.body()["error"]})
                    continue
                await _send_reply(socket, first, stream)

    return router


def _streamed(
    first: Delta, stream: Reply, model: str, request: ChatCompletionRequest
) -> tk.ChatCompletionStream:
    last: list[Delta] = [first]

    async def pieces() -> AsyncIterator[str]:
        try:
            async for delta in stream:
                last[0] = delta
                if delta.text:
                    yield delta.text
        finally:
            stream.cancel()  # the client left early: the model stops this reply

    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return tk.ChatCompletionStream(
        pieces(),
        model=model,
        include_usage=include_usage,
        prompt_tokens=first.prompt_tokens,
        finish_reason=lambda: last[0].finish_reason or "stop",
        completion_tokens=lambda: last[0].completion_tokens,
    )


async def _relay(
    model: tk.DeploymentHandle, body: dict[str, Any], owner: str
) -> dict[str, Any] | tk.EventStream:
    """The upstream's answer to ``body``, as it came: a completion, or its chunks as SSE."""
    answers: tk.DeploymentResponseGenerator[dict[str, Any]] = model.options(
        method_name="relay", stream=True
    ).remote(body, owner)
    try:
        first = await anext(answers)
    except ANSWERED as exc:
        answers.cancel()
        raise as_openai_error(exc) from None
    except BaseException:
        answers.cancel()
        raise
    if not body.get("stream"):
        answers.cancel()
        return first

    async def chunks() -> AsyncIterator[object]:
        try:
            yield {"data": json.dumps(first)}
            async for chunk in answers:
                yield {"data": json.dumps(chunk)}
        except ANSWERED as exc:  # cut off mid-way: an error chunk, and no [DONE]
            yield stream_error(exc).chat_completions()
            return
        except Exception:
            logger.exception("A relayed stream failed")
            yield {
                "data": json.dumps(
                    OpenAIError(502, "The model server failed mid-reply.", "upstream_error").body()
                )
            }
            return
        finally:
            answers.cancel()  # the client left early: the upstream request ends too
        yield {"data": "[DONE]"}

    # Still open at the ingress replica's drain deadline: the error chunk that says retry.
    return tk.EventStream(
        chunks(), ids=False, final_event=lambda: tk.OpenAIErrorEvent.restarting().chat_completions()
    )


async def _send_reply(socket: WebSocket, first: Delta, stream: Reply) -> None:
    """Send one reply over the socket; a ``{"type": "stop"}`` from the client ends it early."""
    await socket.send_json({"type": "start", "prompt_tokens": first.prompt_tokens})
    stop = asyncio.ensure_future(_stop_requested(socket))
    try:
        while True:
            item = asyncio.ensure_future(anext(stream))
            await asyncio.wait({item, stop}, return_when=asyncio.FIRST_COMPLETED)
            if stop.done():
                item.cancel()
                await asyncio.wait({item})
                stop.result()  # a disconnect ends the socket here
                await socket.send_json({"type": "done", "finish_reason": "stopped"})
                return
            try:
                delta = item.result()
            except ANSWERED as exc:
                await socket.send_json({"type": "error", "error": as_openai_error(exc).body()["error"]})
                return
            except Exception:  # the client hears of a failed reply; the socket stays usable
                logger.exception("A reply over the WebSocket failed")
                error = OpenAIError(500, "The model failed; try again.", "server_error")
                await socket.send_json({"type": "error", "error": error.body()["error"]})
                return
            if delta.finish_reason is None:
                await socket.send_json({"type": "delta", "text": delta.text})
                continue
            usage = _usage(first.prompt_tokens, delta.completion_tokens)
            await socket.send_json({"type": "done", "finish_reason": delta.finish_reason, "usage": usage})
            return
    finally:
        stream.cancel()  # stopped or disconnected: the model stops this reply
        stop.cancel()
        await asyncio.wait({stop})


async def _stop_requested(socket: WebSocket) -> None:
    """Returns when the client asks to stop (anything else it sends meanwhile is ignored)."""
    while (await socket.receive_json()).get("type") != "stop":
        pass


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
