"""A model's replica: one engine, and the rules every reply follows whatever the engine —
the context window, stop strings, structured output, the stream's pace and the metrics.
Each reply streams through a :class:`~app_toolkit.llm.replica.reply_stream.ReplyStream`.

The OpenAI ingress (``openai/``) reaches it through a handle: ``generate`` streams
:class:`~app_toolkit.llm.events.Delta` items, ``embed``, ``tokenize`` and ``detokenize``
answer at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator

import app_toolkit as tk
from app_toolkit.exceptions import ConfigError, ContinuationRefused
from app_toolkit.llm import metrics
from app_toolkit.llm.config import LLMConfig
from app_toolkit.llm.engine import Adapters, EmbeddingEngine, EngineLoad, TextEngine
from app_toolkit.llm.engines.adapters import AdapterNotFound, AdapterRefused
from app_toolkit.llm.errors import OpenAIError, bad_parameter, unknown_model
from app_toolkit.llm.events import Delta, Generation, ModelCard
from app_toolkit.llm.protocol import TokenizeRequest
from app_toolkit.llm.replica.choices import merged, seeded
from app_toolkit.llm.replica.continued import continue_generation
from app_toolkit.llm.replica.loading import chat_template_text, engine_for
from app_toolkit.llm.replica.parsers import ReplyParsers, check_installed
from app_toolkit.llm.replica.reply_stream import ReplyStream
from app_toolkit.llm.replica.requests import (
    check_ids,
    check_sampling,
    fitted,
    prompt_ids,
    templated,
    text_messages,
)
from app_toolkit.llm.replica.shaping import Structure, structures_for
from app_toolkit.multiplex import _ModelCache

logger = logging.getLogger("app_toolkit.llm")

#: Why a model cannot take engine_kwargs.chat_template.
_NO_TEMPLATE = "chat_template needs a chat model with a tokenizer: remove chat_template"


class LLMServer:
    """Serves the model ``llm_config`` describes, from the engine it names. Its constructor
    is async, as Ray Serve LLM's ``LLMServer``'s is (a subclass awaits
    ``super().__init__(llm_config)``). After a reply's first piece, which goes at once,
    ``experimental_configs.stream_batching_interval_ms`` > 0 sends the pieces at most that
    often (Ray Serve LLM's pacing)."""

    async def __init__(self, llm_config: LLMConfig) -> None:  # type: ignore[misc]  # awaited, as Ray Serve does
        self._config = llm_config
        self._model = llm_config.model_id
        engine = self._engine = engine_for(llm_config)
        self._interval_s = llm_config.experimental_configs.stream_batching_interval_ms / 1000
        # LoRA adapters, as multiplexed models ("model_id:adapter"): the least recently used
        # goes beyond max_num_adapters_per_replica, and callers prefer replicas holding one.
        lora = llm_config.lora_config
        self._adapters: _ModelCache[_Adapter] | None = None
        self._engine_adapters: Adapters | None = None
        if lora is not None and lora.dynamic_lora_loading_path is not None:
            if engine.task == "embed" or engine.adapters is None:
                raise ConfigError(
                    f"{self._model}: the {engine.name} engine serves no LoRA adapters; remove "
                    "lora_config, or serve the model on an engine that has them (transformers)"
                )
            self._engine_adapters = engine.adapters
            self._adapters = _ModelCache(
                self._load_adapter, lora.max_num_adapters_per_replica, f"{self._model} LoRA adapters"
            )
        given = llm_config.engine_kwargs.chat_template
        if given is not None and engine.task == "embed":
            raise ConfigError(f"{self._model}: engine_kwargs.{_NO_TEMPLATE}")
        template = None if given is None else chat_template_text(given)  # before the weights load
        check_installed(llm_config)  # vLLM's parsers: before the weights load too
        # In a worker thread: the replica's event loop keeps answering (health checks; on
        # the local backend, every other part of the process) while the weights load.
        await asyncio.to_thread(self._engine.load)
        try:
            self._parsers = self._fitted_to_model(llm_config, template)
        except BaseException:
            await engine.close()  # a failed start lets go of the model (vLLM: its processes)
            raise
        self._card = ModelCard(
            id=self._model,
            kind=engine.task,
            context_window=engine.context_window,
            created=int(time.time()),
            dimensions=engine.dimensions if engine.task == "embed" else 0,
            engine=engine.name,
        )
        logger.info("%s is served by the %s engine", self._model, self._engine.name)

    def _fitted_to_model(self, config: LLMConfig, template: str | None) -> ReplyParsers | None:
        """What needs the loaded model: the chat template set on its tokenizer, and vLLM's
        parsers of its replies made (None: none named). ConfigError where neither fits."""
        engine = self._engine
        if template is not None:
            if engine.tokenizer is None:
                raise ConfigError(f"{self._model}: engine_kwargs.{_NO_TEMPLATE} ({engine.name} engine)")
            engine.tokenizer.chat_template = template
        named = config.engine_kwargs.parsers
        if not named:
            return None
        if engine.tokenizer is None:
            raise ConfigError(
                f"{self._model}: engine_kwargs {', '.join(named)} need a chat model with a tokenizer "
                f"({engine.name} engine): remove them"
            )
        return ReplyParsers(config, engine.tokenizer)

    async def __del__(self) -> None:
        """The replica stops: the engine lets go of its adapters and the model."""
        if self._adapters is not None:
            await self._adapters.release_all()
        await self._engine.close()

    async def check_health(self) -> None:
        """The replica's health check (Ray Serve LLM's too): fails once the engine can serve
        no more, and the replica is replaced."""
        await self._engine.check_health()

    def card(self) -> ModelCard:
        return self._card

    def current_load(self) -> EngineLoad:
        return self._text_engine().current_load()

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """The engine's load as custom autoscaling metrics, sampled while the deployment
        autoscales (docs/llm.md, "Autoscaling on the engine's load"; :meth:`_load_stats`)."""
        return self._load_stats()

    async def record_routing_stats(self) -> dict[str, float | str]:
        """The engine's load as routing stats (the prefix-aware router reads them:
        docs/routing.md; :meth:`_load_stats`), and the ``engine`` that runs (its name, as
        ``/v1/models``' ``owned_by`` tells it apart), which ``status()`` shows per replica."""
        return {"engine": self._engine.name, **self._load_stats()}

    def _load_stats(self) -> dict[str, float]:
        """What the stats hooks report: replies ``running`` and ``waiting``, decode
        ``slots`` (0: no limit known) and ``kv_cache_use`` (0 to 1). On the event loop,
        waiting for nothing; an embedding model's: none."""
        if self._engine.task == "embed":
            return {}
        load = self.current_load()
        return {
            "running": float(load.running),
            "waiting": float(load.waiting),
            "slots": float(load.slots),
            "kv_cache_use": load.kv_cache_use,
        }

    def adapters(self) -> list[str]:
        """The LoRA adapters its folder holds now, as clients name them ("model_id:adapter")."""
        if self._engine_adapters is None:
            return []
        return [f"{self._model}:{adapter}" for adapter in self._engine_adapters.ids()]

    async def _load_adapter(self, model_id: str) -> _Adapter:
        """The multiplexed loader: ``model_id`` is "model_id:adapter"."""
        adapters = self._engine_adapters
        assert adapters is not None  # the cache exists only with them
        adapter = model_id.partition(":")[2]
        await adapters.load(adapter)
        return _Adapter(adapters, adapter)

    def _adapter_named(self, model_id: str) -> str:
        """The adapter a request names (its multiplexed model id "model_id:adapter"); "" for
        the base model. 404 for an adapter this model does not have."""
        if not model_id or model_id == self._model:
            return ""
        base, _, adapter = model_id.partition(":")
        found = self._engine_adapters
        # Checked before the adapters' cache: a name that is not there evicts none that is.
        if base != self._model or self._adapters is None or found is None or not found.holds(adapter):
            raise unknown_model(model_id, [self._model, *self.adapters()])
        return adapter

    async def _load_named(self, model_id: str) -> None:
        """Load the adapter ``model_id`` names (:meth:`_adapter_named` checked it)."""
        assert self._adapters is not None  # a named adapter exists only with them
        try:
            await self._adapters.get(model_id)
        except AdapterNotFound:
            raise unknown_model(model_id, [self._model, *self.adapters()]) from None
        except AdapterRefused as exc:
            raise bad_parameter("model", str(exc)) from None

    @tk.continuable(continue_generation)
    async def generate(self, generation: Generation) -> AsyncIterator[Delta]:
        """The first item counts the prompt; then text pieces (or tool-call fragments); the
        last says why the reply ended. Raises :class:`OpenAIError` before any item when the
        request cannot be served (the prompt does not fit, a bad grammar); the engine's
        :class:`~app_toolkit.llm.engine.EngineStopped` when it stops under the reply (a
        ``ReplicaUnavailableError``).

        Continuable: when the replica is lost mid-reply (or its engine stops under it), its
        caller sends the reply to another replica with the pieces it has, and the reply
        goes on from its tokens so far (``replica/continued.py``); no prompt count then."""
        engine = self._text_engine()
        model_id = tk.get_multiplexed_model_id()
        adapter = self._adapter_named(model_id)
        adapters = self._engine_adapters
        if adapter and adapters is not None:
            # Held before it loads: an eviction while this request waits for the load (or
            # for the loop after it) leaves it to the reply, which releases it at its end.
            adapters.hold(adapter)
        try:
            if adapter:
                await self._load_named(model_id)
            # Closed with this stream, at once: the engine stops the reply now.
            async with contextlib.aclosing(self._generated(engine, generation, adapter)) as deltas:
                async for delta in deltas:
                    yield delta
        finally:
            if adapter and adapters is not None:
                adapters.release(adapter)

    async def _generated(
        self, engine: TextEngine, generation: Generation, adapter: str
    ) -> AsyncGenerator[Delta, None]:
        check_sampling(engine, generation.sampling)  # before the grammar and the prompt are made
        able = engine.capabilities
        # Each prompt (a completion's several, or the one) with its n choices, all checked
        # before any reply starts.
        asked = [dataclasses.replace(generation, prompt=one, prompts=()) for one in generation.prompts] or [
            generation
        ]
        count = len(asked) * generation.n
        structures: list[Structure | None] = [None] * count
        # vLLM's parsers read a chat reply (parsers.py); "auto" tool calls are then parsed
        # from free text, not made by the grammar.
        parsed_calls = self._parsers is not None and self._parsers.parses_calls(generation)
        if generation.response_format is not None or generation.tools or generation.tool_choice is not None:
            # Checked before the prompt is built from the tools; a grammar compiles in a
            # worker thread (llguidance's first view of a tokenizer takes a fraction of a
            # second), so the replies streaming meanwhile are not held up.
            structures = await asyncio.to_thread(
                structures_for,
                engine.tokenizer,
                generation.response_format,
                generation.tools,
                "none" if parsed_calls else generation.tool_choice,
                bool(generation.parallel_tool_calls),
                count,
                "" if able.structured else engine.name,
            )
        reading = None if self._parsers is None else self._parsers.reading(generation)
        prompts = [prompt_ids(engine, one, as_given=reading is not None) for one in asked]
        if reading is not None:  # a chat request: one prompt
            generation = asked[0] = reading.generation
            structures = [
                reading.structure(None if one is None else one.constraint, prompts[0]) for one in structures
            ]
        samplings = [fitted(engine, one, len(prompt)) for one, prompt in zip(asked, prompts, strict=True)]
        continued = generation.continued  # its tokens: one entry per choice (continued.py)
        if continued is not None and any(continued.tokens):
            _check_continuable(engine, structures)
        if continued is None:
            yield Delta(prompt_tokens=sum(len(prompt) for prompt in prompts))
        # Choice i * n + j: prompt i's j-th (seeded with the seed plus j, as vLLM's children).
        so_far = (None,) * count if continued is None else continued.tokens
        replies = [
            ReplyStream(
                self._model,
                engine,
                prompt,
                seeded(sampling, index % generation.n),
                structures[index],
                generation,
                self._interval_s,
                adapter,
                so_far[index] or (),
            ).deltas()
            if continued is None or so_far[index] is not None
            else _finished()
            for index, (prompt, sampling) in enumerate(
                (prompt, sampling)
                for prompt, sampling in zip(prompts, samplings, strict=True)
                for _ in range(generation.n)
            )
        ]
        # Closed with this stream, now.
        async with contextlib.aclosing(replies[0] if len(replies) == 1 else merged(replies)) as deltas:
            async for delta in deltas:
                yield delta

    async def embed(
        self, inputs: list[str] | list[list[int]], dimensions: int | None = None
    ) -> tuple[list[list[float]], int]:
        """One vector per input (a text or its token ids), and the tokens they took."""
        engine = self._embedding_engine()
        if not inputs:
            return [], 0
        if dimensions is not None and dimensions != engine.dimensions:
            raise bad_parameter(
                "dimensions",
                f"This model's embeddings have {engine.dimensions} dimensions; got dimensions={dimensions}.",
            )
        # A text is tokenised once, here: its ids are counted, checked and sent.
        rows = [engine.encode(item) if isinstance(item, str) else item for item in inputs]
        check_ids(engine, [token for item in inputs if not isinstance(item, str) for token in item], "input")
        longest = max(len(row) for row in rows)
        if longest > engine.context_window:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {engine.context_window} tokens; an input "
                f"takes {longest}. Shorten it.",
                "invalid_request_error",
                "context_length_exceeded",
                "input",
            )
        vectors = await engine.embed(rows)
        counted = sum(len(row) for row in rows)
        metrics.PROMPT_TOKENS.inc(self._model, amount=counted)
        return vectors, counted

    def tokenize(self, request: TokenizeRequest) -> dict[str, object]:
        """vLLM's ``/tokenize`` answer for ``request``."""
        engine = self._engine
        if request.messages is not None:
            text_engine = self._text_engine()
            prefill, opened = request.continue_final_message, request.add_generation_prompt
            if prefill and opened:
                raise bad_parameter(
                    "continue_final_message",
                    "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                )
            tokens = templated(
                text_engine,
                text_messages(request.messages),
                add_generation_prompt=opened,
                continue_final_message=prefill,
            )
        elif request.prompt is not None:
            tokens = engine.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        else:
            raise bad_parameter("prompt", "Give a prompt or messages to tokenize.")
        answer: dict[str, object] = {
            "count": len(tokens),
            "max_model_len": engine.context_window,
            "tokens": tokens,
        }
        if request.return_token_strs:
            answer["token_strs"] = [engine.decode([token]) for token in tokens]
        return answer

    def detokenize(self, tokens: list[int]) -> str:
        """The text of ``tokens``; an id outside the vocabulary is a 400 naming ``tokens``."""
        check_ids(self._engine, tokens, "tokens")
        return self._engine.decode(tokens)

    def _text_engine(self) -> TextEngine:
        engine = self._engine
        if engine.task == "embed":
            raise bad_parameter("model", f"{self._model!r} is an embedding model; it does not generate text.")
        return engine

    def _embedding_engine(self) -> EmbeddingEngine:
        engine = self._engine
        if engine.task == "generate":
            raise bad_parameter("model", f"{self._model!r} generates text; it does not make embeddings.")
        return engine


def _check_continuable(engine: TextEngine, structures: list[Structure | None]) -> None:
    """Whether ``engine`` can continue a reply shaped by ``structures`` from its tokens so
    far; if not, the reply ends as its replica's loss would have ended it
    (``ContinuationRefused``, a ``RequestLostError``, not sent on again)."""
    able = engine.capabilities.continuation
    constrained = any(one is not None and one.constraint is not None for one in structures)
    if able == "all" or (able == "unconstrained" and not constrained):
        return
    what = "a reply under a grammar" if able else "a reply"
    raise ContinuationRefused(f"The {engine.name} engine cannot continue {what} whose replica was lost")


async def _finished() -> AsyncGenerator[Delta, None]:
    """A choice of a continued reply that had finished before its replica was lost."""
    return
    yield


class _Adapter:
    """A loaded adapter, as the multiplexed cache holds it: evicted, it is detached once no
    reply uses it."""

    def __init__(self, adapters: Adapters, adapter_id: str) -> None:
        self._adapters = adapters
        self.adapter_id = adapter_id

    async def aclose(self) -> None:
        self._adapters.unload(self.adapter_id)
