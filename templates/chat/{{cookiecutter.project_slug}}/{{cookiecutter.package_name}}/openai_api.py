"""The OpenAI-compatible API (``/v1/models``, ``/v1/chat/completions``, ``/v1/responses``)
and the same chat over a WebSocket (``/v1/chat/ws``). With API keys on, the toolkit's front
lets in only requests with a key, under the key's limits (``access.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import app_toolkit as tk
from app_toolkit.llm import (
    ANSWERED,
    Delta,
    DeltaStream,
    OpenAIError,
    ResponsesReply,
    ResponsesRequest,
    as_openai_error,
    bad_parameter,
    chat_completion,
    chat_stream,
    invalid_request,
    open_reply,
    read_whole,
    responses_events,
    responses_generation,
    responses_stream,
    stream_error,
    unknown_model,
    usage,
)
from fastapi import APIRouter, Depends, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from .access import caller
from .schemas import ChatCompletionRequest, Generation
from .settings import Settings

logger = logging.getLogger(__name__)


def build_router(settings: Settings, model_app: tk.Application) -> APIRouter:
    router = APIRouter()
    model_name = settings.model_name

    def generation_of(request: ChatCompletionRequest | ResponsesRequest, owner: str) -> Generation:
        if request.model not in (None, "", model_name):
            raise unknown_model(request.model, [model_name])
        if isinstance(request, ResponsesRequest):
            return dataclasses.replace(_responses_generation(request, settings), owner=owner)
        return dataclasses.replace(request.generation(settings), owner=owner)

    entry = {"id": model_name, "object": "model", "created": 0, "owned_by": "app_toolkit"}

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [entry]}

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != model_name:
            raise unknown_model(model_id, [model_name])
        return entry

    @router.post("/v1/chat/completions", response_model=None)
    async def completions(
        request: ChatCompletionRequest,
        owner: str = Depends(caller),
        model: tk.DeploymentHandle = tk.Depends(model_app),
    ) -> dict[str, Any] | tk.EventStream:
        relayed = request.relayed(settings)
        if relayed is not None:  # tool calls, several choices…: the upstream answers it whole
            return await _relay(model, relayed, owner)
        first, stream = await open_reply(model, generation_of(request, owner))
        if request.stream:
            include_usage = bool(request.stream_options and request.stream_options.include_usage)
            return chat_stream(first, stream, model_name, include_usage)
        return chat_completion(await read_whole(first, stream), model_name)

    @router.post("/v1/responses", response_model=None)
    async def responses(
        request: ResponsesRequest,
        owner: str = Depends(caller),
        model: tk.DeploymentHandle = tk.Depends(model_app),
    ) -> dict[str, Any] | tk.EventStream:
        """OpenAI's Responses API (the module's): text input and output, plain or streamed;
        this server keeps no responses."""
        request = request.checked()
        first, stream = await open_reply(model, generation_of(request, owner))
        kept_nowhere = request.model_copy(update={"store": False})
        reply = ResponsesReply(kept_nowhere, model_name, first.prompt_tokens, conversation=())
        if request.stream:
            return responses_stream(responses_events(reply, stream), reply.next_number)
        return reply.read(await read_whole(first, stream))

    @router.websocket("/v1/chat/ws")
    async def chat_socket(
        socket: WebSocket,
        owner: str = Depends(caller),
        model: tk.DeploymentHandle = tk.Depends(model_app),
    ) -> None:
        await socket.accept()
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                message = await socket.receive_json()
                try:
                    request = ChatCompletionRequest.model_validate(message)
                    await tk.count_request(socket)  # each message is a request of the key
                    first, stream = await open_reply(model, generation_of(request, owner))
                except ValidationError as exc:
                    await socket.send_json(
                        {"type": "error", "error": invalid_request(exc.errors()).body()["error"]}
                    )
                    continue
                except OpenAIError as exc:
                    await socket.send_json({"type": "error", "error": exc.body()["error"]})
                    continue
                except tk.APIKeyRefused as exc:  # over the key's limits: this message is refused
                    await socket.send_json({"type": "error", "error": exc.error})
                    continue
                await _send_reply(socket, first, stream)

    return router


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


async def _send_reply(socket: WebSocket, first: Delta, stream: DeltaStream) -> None:
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
            counted = usage(first.prompt_tokens, delta.completion_tokens)
            await socket.send_json({"type": "done", "finish_reason": delta.finish_reason, "usage": counted})
            return
    finally:
        stream.cancel()  # stopped or disconnected: the model stops this reply
        stop.cancel()
        await asyncio.wait({stop})


async def _stop_requested(socket: WebSocket) -> None:
    """Returns when the client asks to stop (anything else it sends meanwhile is ignored)."""
    while (await socket.receive_json()).get("type") != "stop":
        pass


def _responses_generation(request: ResponsesRequest, settings: Settings) -> Generation:
    """What the model produces for a Responses API request, read as the module reads it
    (:func:`app_toolkit.llm.responses_generation`), with this server's defaults."""
    if request.previous_response_id:
        raise bad_parameter(
            "previous_response_id",
            "This server keeps no responses; send the whole conversation in input.",
            "unsupported_parameter",
        )
    read = responses_generation(request, request.messages(_no_reference), received_at=0.0)
    if read.response_format is not None:
        raise bad_parameter(
            "text.format", "This server writes text only: leave text.format out.", "unsupported_parameter"
        )
    return Generation(
        messages=tuple((message["role"], message["content"]) for message in read.messages),
        max_tokens=settings.reply_tokens(request.max_output_tokens),
        temperature=settings.default_temperature if request.temperature is None else request.temperature,
        top_p=read.sampling.top_p,
    )


def _no_reference(item_id: str, param: str) -> dict[str, Any]:
    raise bad_parameter(
        param,
        "This server keeps no responses: send earlier replies as assistant messages "
        "(with the AI SDK, set providerOptions.openai.store to false).",
        "unsupported_parameter",
    )
