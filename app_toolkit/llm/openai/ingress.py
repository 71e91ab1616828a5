"""The OpenAI-compatible ingress: one deployment in front of every model's replicas,
routing each request by its ``model`` (Ray Serve LLM's ``OpenAiIngress``; vLLM's paths)."""

from __future__ import annotations

import asyncio
import base64
import functools
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

from fastapi import APIRouter, Query, Request, Response
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

import app_toolkit as tk
from app_toolkit.config.api_keys import UNAUTHORIZED_MESSAGE, APIKey, digest_of, key_headers, presented_key
from app_toolkit.llm import errors
from app_toolkit.llm.errors import ANSWERED, OpenAIError, bad_parameter, unknown_model
from app_toolkit.llm.events import ModelCard
from app_toolkit.llm.openai import chat, completions, response_events, responses
from app_toolkit.llm.openai.replies import open_reply, read_choices, read_whole, usage
from app_toolkit.llm.openai.response_store import ResponseStore
from app_toolkit.llm.openai.responses import ResponsesRequest
from app_toolkit.llm.openai_shapes import ChatCompletion, ModelEntry, ResponseObject, TextCompletion
from app_toolkit.llm.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
)

#: How long /v1/models waits for a model's replica to describe it.
CARD_TIMEOUT_S = 2.0
#: How long a model's list of LoRA adapters is served before its replica is asked again.
ADAPTERS_TTL_S = 5.0


#: WebSocket close code for a connection refused by policy (RFC 6455): no valid key.
CLOSE_POLICY_VIOLATION = 1008


class KeyGuard:
    """vLLM's ``--api-key`` (``LLMServingArgs.api_key``): with keys, every request to the
    app needs one, as ``Authorization: Bearer <key>`` or ``X-API-Key``, whatever its path or
    method (the docs pages and 404s included), before any of it is read; the front's 401.
    A header sent twice opens nothing. Only the app's CORS middleware comes before it (a
    preflight carries no key; a browser reads the 401 it answers)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not _lets_in(scope):
            error = OpenAIError(401, UNAUTHORIZED_MESSAGE, "invalid_request_error", "invalid_api_key")
            await errors.answer(error)(scope, receive, send)
            return
        if scope["type"] == "websocket" and not _lets_in(scope):  # (a subclass's extra route)
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": CLOSE_POLICY_VIOLATION})
            return
        await self.app(scope, receive, send)


def _lets_in(scope: Scope) -> bool:
    ingress = tk.get_replica_context().servable_object
    if not isinstance(ingress, OpenAIIngress):  # never served without its keys
        raise TypeError(f"the OpenAI app is served by {type(ingress).__name__}, not OpenAIIngress")
    if not ingress.key_hashes:
        return True
    presented, well_formed = presented_key(*key_headers(scope["headers"]))
    return digest_of(presented) in ingress.key_hashes and well_formed


#: The OpenAI endpoints, methods of :class:`OpenAIIngress`; ``ingress_app.py`` makes the
#: FastAPI app of each OpenAI application from them.
routes = APIRouter()


class OpenAIIngress:
    """Routes OpenAI requests to the model each names (``models`` maps a model id to the
    handle of its deployment; ``kinds`` says which generate text and which embed; models in
    ``lora`` serve LoRA adapters, named "model_id:adapter"; ``api_keys``: the hashes of the
    keys every route needs, none for none).

    ``build_openai_app`` serves it, or a subclass named by ``ingress_cls_config``
    (docs/llm.md): its methods may be overridden (a route then calls the override), and
    it may add routes of its own methods (``extra_routes``, an ``APIRouter`` whose routes
    decorate them) and middleware (``middleware``, Starlette ``Middleware`` entries, run
    after the API key check)."""

    #: A subclass's own routes: an APIRouter whose routes are its methods.
    extra_routes: ClassVar[APIRouter | None] = None
    #: A subclass's middleware (``starlette.middleware.Middleware``), outermost first.
    middleware: ClassVar[Sequence[Middleware]] = ()

    def __init__(
        self,
        models: dict[str, tk.DeploymentHandle],
        kinds: dict[str, str],
        lora: tuple[str, ...] = (),
        api_keys: tuple[str, ...] = (),
    ) -> None:
        self._models = models
        #: The SHA-256 of each key of ``LLMServingArgs.api_key`` (its ``sha256:<hex>``).
        self.key_hashes = frozenset(APIKey.digest_of_hash(key) for key in api_keys)
        self._kinds = kinds
        self._lora = frozenset(lora)
        self._adapter_lists: dict[str, tuple[float, list[str]]] = {}  # model -> (when, adapters)
        self._cards: dict[str, ModelCard] = {}
        self._responses = ResponseStore()

    async def __del__(self) -> None:
        """The replica stops: the responses still being produced stop too."""
        await self._responses.close()

    def _pick(self, model: str | None, kind: str | None = None) -> tuple[str, tk.DeploymentHandle]:
        """The model a request names; with none named, the one model served (of ``kind``)."""
        if model:
            handle = self._models.get(model)
            if handle is not None:
                return model, handle
            base, _, adapter = model.partition(":")
            if adapter and base in self._lora:
                # The adapter is a multiplexed model of the base's deployment: replicas that
                # hold it are preferred; the replica answers 404 if it does not exist.
                return model, self._models[base].options(multiplexed_model_id=model)
            raise unknown_model(model, list(self._models))
        fitting = [name for name, served in self._kinds.items() if kind is None or served == kind]
        if len(fitting) != 1:
            raise bad_parameter(
                "model",
                f"Name the model: this server has {', '.join(repr(n) for n in self._models)}.",
                "missing_model",
            )
        return fitting[0], self._models[fitting[0]]

    async def _card(self, model: str) -> ModelCard | None:
        """The model's card from its replica (kept once read); None while no replica of it
        answers within :data:`CARD_TIMEOUT_S` (loading, not placed, scaled to zero before
        it was ever read): a model is listed once it can answer."""
        card = self._cards.get(model)
        if card is not None:
            return card
        try:
            async with asyncio.timeout(CARD_TIMEOUT_S):
                read: ModelCard = await self._models[model].card.remote()
        except (TimeoutError, *ANSWERED):
            return None
        self._cards[model] = read
        return read

    async def _ready_card(self, model: str) -> ModelCard:
        card = await self._card(model)
        if card is None:
            raise OpenAIError(
                503, f"The model {model!r} is starting; retry.", "server_error", "model_not_ready"
            )
        return card

    async def _adapters(self, model: str) -> list[str]:
        """The adapters of a model serving LoRA, as its replica found them at most
        :data:`ADAPTERS_TTL_S` ago; the last list known when no replica answers within
        :data:`CARD_TIMEOUT_S` (every slot busy with replies, say)."""
        if model not in self._lora:
            return []
        listed_at, known = self._adapter_lists.get(model, (-ADAPTERS_TTL_S, []))
        if time.monotonic() - listed_at < ADAPTERS_TTL_S:
            return known
        try:
            async with asyncio.timeout(CARD_TIMEOUT_S):
                found: list[str] = await self._models[model].adapters.remote()
        except (TimeoutError, *ANSWERED):
            found = known  # asked again after the TTL, not at every call meanwhile
        self._adapter_lists[model] = (time.monotonic(), found)
        return found

    async def _entries(self, model: str) -> list[ModelEntry]:
        card, adapters = await asyncio.gather(self._card(model), self._adapters(model))
        if card is None:
            return []
        return [card.entry(), *(card.adapter_entry(adapter) for adapter in adapters)]

    @routes.get("/health")
    async def health(self) -> Response:
        """vLLM's health check: 200 with no body while the ingress serves (each model's
        replicas have their own health checks: ``status()``)."""
        return Response(status_code=200)

    @routes.get("/version")
    async def version(self) -> dict[str, str]:
        """vLLM's ``/version``: here the toolkit's version."""
        return {"version": tk.__version__}

    # Where FastAPI makes the return annotation the response model, it is a plain JSON object
    # (a TypedDict would be validated and published as a schema of its own).
    @routes.get("/v1/models")
    async def list_models(self) -> dict[str, object]:
        listed = await asyncio.gather(*(self._entries(name) for name in self._models))  # 2 s at most in all
        return {"object": "list", "data": [entry for entries in listed for entry in entries]}

    @routes.get("/v1/models/{model:path}")
    async def get_model(self, model: str) -> Mapping[str, object]:
        if model in self._models:
            return (await self._ready_card(model)).entry()
        base = model.partition(":")[0]
        if base in self._lora and model in await self._adapters(base):
            return (await self._ready_card(base)).adapter_entry(model)
        raise unknown_model(model, list(self._models))

    @routes.post("/v1/chat/completions", response_model=None)
    async def chat_completions(
        self, request: ChatCompletionRequest, caller: Request
    ) -> ChatCompletion | tk.EventStream:
        received_at = time.time()
        name, handle = self._pick(request.checked().model, "generate")
        first, stream = await open_reply(handle, chat.generation(request, received_at), _charger(caller))
        if request.stream:
            return chat.streamed(
                first,
                stream,
                name,
                request.include_usage,
                bool(request.logprobs),
                request.n,
                vllm_fields=True,
                role=chat.reply_role(request),
            )
        wholes = await read_choices(first, stream, request.n)
        role = chat.reply_role(request)
        return chat.completion(wholes, name, bool(request.logprobs), vllm_fields=True, role=role)

    @routes.post("/v1/completions", response_model=None)
    async def text_completions(
        self, request: CompletionRequest, caller: Request
    ) -> TextCompletion | tk.EventStream:
        received_at = time.time()
        name, handle = self._pick(request.checked().model, "generate")
        generation = completions.generation(request, received_at)
        prompts = generation.prompts or (generation.prompt,)
        # Echoed text first: a detokenizing call ends before the reply holds a place.
        echoed = (
            [await self._echoed(handle, prompt) for prompt in prompts]
            if request.echo
            else [""] * len(prompts)
        )
        # Checks the prompts (a 400 names one).
        first, stream = await open_reply(handle, generation, _charger(caller))
        wanted = request.logprobs is not None
        if request.stream:
            return completions.streamed(
                first.prompt_tokens, stream, name, request.include_usage, echoed, wanted, request.n
            )
        wholes = await read_choices(first, stream, len(prompts) * request.n)
        return completions.completion(wholes, name, echoed, wanted, request.n)

    @staticmethod
    async def _echoed(handle: tk.DeploymentHandle, prompt: str | tuple[int, ...] | None) -> str:
        """A prompt's text, as ``echo`` repeats it (token ids detokenized by the model)."""
        if isinstance(prompt, str):
            return prompt
        try:
            text: str = await handle.detokenize.remote(list(prompt or ()))
        except OpenAIError as refused:
            if refused.param != "tokens":
                raise
            # An id outside the vocabulary: the prompt's.
            raise OpenAIError(refused.status, refused.message, refused.type, refused.code, "prompt") from None
        return text

    @routes.post("/v1/responses", response_model=None)
    async def create_response(
        self, request: ResponsesRequest, caller: Request
    ) -> ResponseObject | tk.EventStream:
        received_at = time.time()
        request.checked()
        earlier = self._responses.conversation(request.previous_response_id)
        name, handle = self._pick(request.model, "generate")
        conversation = earlier + request.messages(self._responses.referenced)
        try:
            generation = responses.generation(request, conversation, received_at)
            first, stream = await open_reply(handle, generation, _charger(caller))
        except OpenAIError as refused:
            raise responses.renamed(refused) from None
        reply = responses.Reply(request, name, first.prompt_tokens, conversation)
        if not request.stream:
            answer = reply.read(await read_whole(first, stream))
            if request.store:
                self._responses.keep(reply)
            return answer
        events = response_events.produced(reply, stream)
        if not request.store:
            return response_events.streamed(events, reply.next_number)
        try:
            followed = await self._responses.produce(reply, events)
        except BaseException:
            stream.cancel()  # refused (503): the model stops this reply
            raise
        return response_events.streamed(followed.events, followed.next_number)

    @routes.get("/v1/responses/{response_id}", response_model=None)
    async def get_response(
        self, response_id: str, stream: bool = False, starting_after: int | None = Query(None, ge=0)
    ) -> ResponseObject | tk.EventStream:
        if not stream:
            return self._responses.get(response_id).response()
        followed = await self._responses.follow(response_id, starting_after)
        return response_events.streamed(followed.events, followed.next_number)

    @routes.delete("/v1/responses/{response_id}")
    async def delete_response(self, response_id: str) -> dict[str, object]:
        self._responses.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    @routes.post("/v1/embeddings")
    async def embeddings(self, request: EmbeddingRequest, caller: Request) -> dict[str, object]:
        inputs = request.inputs()
        name, handle = self._pick(request.model, "embed")
        vectors, tokens = await handle.embed.remote(inputs, request.dimensions)
        tk.charge_tokens(caller, tokens)
        encode = _base64 if request.encoding_format == "base64" else list
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": encode(vector)}
                for index, vector in enumerate(vectors)
            ],
            "model": name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    @routes.post("/tokenize")
    async def tokenize(self, request: TokenizeRequest) -> dict[str, object]:
        if (request.prompt is None) == (request.messages is None):
            raise bad_parameter("prompt", "Give either prompt or messages.")
        _, handle = self._pick(request.model)
        answer: dict[str, object] = await handle.tokenize.remote(request)
        return answer

    @routes.post("/detokenize")
    async def detokenize(self, request: DetokenizeRequest) -> dict[str, object]:
        _, handle = self._pick(request.model)
        return {"prompt": await handle.detokenize.remote(request.tokens)}


def _base64(vector: list[float]) -> str:
    """OpenAI's ``encoding_format: base64``: the floats as little-endian float32, base64."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


__all__ = ["OpenAIError", "OpenAIIngress", "usage"]


def _charger(caller: Request) -> Callable[[int], None] | None:
    """What charges a reply's tokens to the caller's API key (None: it presented none)."""
    return functools.partial(tk.charge_tokens, caller) if tk.api_key_name(caller) is not None else None
