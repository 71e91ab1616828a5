"""Any OpenAI-compatible server (vLLM, llama.cpp's server, Ollama, OpenAI) as the model,
through the official ``openai`` client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
from app_toolkit.llm import OpenAIError

from ..scaling import EngineLoad
from ..schemas import Generation
from ..settings import Settings


class UpstreamEngine:
    counts_cancellations = False

    def __init__(self, settings: Settings) -> None:
        self.context_window = 1 << 30  # the upstream enforces its own; its 400 is passed on
        self._model = settings.upstream_model
        self._continues = settings.upstream_continues
        self._client = openai.AsyncOpenAI(
            base_url=settings.upstream_url,
            api_key=settings.upstream_api_key.get_secret_value(),
            timeout=settings.upstream_timeout_s,
            max_retries=0,  # the caller sees a 502 at once and may retry; no hidden waits
        )
        self._active = 0
        self._tokens = 0
        # Per request under way, the tokens it may still produce (what it asked for, less
        # the pieces seen; 0 where a relayed request set no limit).
        self._remaining: dict[int, int] = {}

    def load(self) -> None:
        return None

    def count_prompt(self, generation: Generation) -> int:
        return sum(len(content) for _, content in generation.messages) // 4  # an estimate

    async def stream(self, generation: Generation) -> AsyncIterator[str]:
        messages: Any = [{"role": role, "content": content} for role, content in generation.messages]
        options = dict(generation.upstream_options)  # seed, response_format, …
        if generation.prefix:  # a continued reply: the upstream goes on from its text
            if not self._continues:
                raise OpenAIError(
                    502,
                    "The model server cannot continue a reply its first replica lost "
                    "(CHAT_UPSTREAM_CONTINUES=true tells this service a vLLM server can).",
                    "upstream_error",
                )
            messages.append({"role": "assistant", "content": generation.prefix})
            options |= {"continue_final_message": True, "add_generation_prompt": False}  # vLLM's
        key = id(messages)
        self._remaining[key] = generation.max_tokens
        self._active += 1
        try:
            chunks = await self._ask(
                model=self._model,
                messages=messages,
                max_tokens=generation.max_tokens,
                temperature=generation.temperature,
                top_p=generation.top_p,
                stop=list(generation.stop) or None,
                stream=True,
                extra_body=options or None,
            )
            async with chunks:  # leaving early closes the upstream request: it stops generating
                async for chunk in chunks:
                    text = chunk.choices[0].delta.content if chunk.choices else None
                    if text:
                        self._tokens += 1
                        self._remaining[key] = max(0, self._remaining[key] - 1)
                        yield text
        finally:
            self._active -= 1
            del self._remaining[key]

    async def relay(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """A whole request passed on (tools, ``n``, log probabilities, image parts); the
        answer comes back field for field as the upstream sent it."""
        options = dict(body)
        model, messages, stream = (
            options.pop("model"),
            options.pop("messages"),
            bool(options.pop("stream", False)),
        )
        key = id(options)
        self._remaining[key] = int(options.get("max_completion_tokens") or options.get("max_tokens") or 0)
        self._active += 1
        try:
            answer = await self._ask(model=model, messages=messages, stream=stream, extra_body=options)
            if not stream:
                yield answer.model_dump(mode="json", exclude_unset=True)
                return
            async with answer:
                async for chunk in answer:
                    self._tokens += 1
                    self._remaining[key] = max(0, self._remaining[key] - 1)
                    yield chunk.model_dump(mode="json", exclude_unset=True)
        finally:
            self._active -= 1
            del self._remaining[key]

    async def _ask(self, **request: Any) -> Any:
        """The upstream's chat completion (or its stream); its refusal becomes a OpenAIError."""
        try:
            return await self._client.chat.completions.create(**request)
        except openai.APIStatusError as exc:
            status = exc.status_code if 400 <= exc.status_code < 500 else 502
            error = exc.body if isinstance(exc.body, dict) else {}  # OpenAI's error object
            message = error.get("message") or exc.message
            raise OpenAIError(
                status, f"The model server refused: {message}", "upstream_error", param=error.get("param")
            ) from None
        except openai.APIError as exc:
            raise OpenAIError(
                502, f"The model server is unreachable: {exc.message}", "upstream_error"
            ) from None

    def stats(self) -> dict[str, int]:
        return {"active": self._active, "tokens": self._tokens}

    def current_load(self) -> EngineLoad:
        """No slots known here: the upstream queues and batches out of sight; the requests
        under way and the tokens they may still produce."""
        return EngineLoad.of(0, tuple(self._remaining.values()))

    async def close(self) -> None:
        await self._client.close()
