"""A deterministic backend: the reply repeats the last user message, word by word, at a
fixed pace. For tests and load tests: no model, same streaming path (the toolkit's echo
engine, with words for tokens)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from app_toolkit.llm import EchoEngine as WordEcho

from ..scaling import EngineLoad
from ..schemas import Generation
from ..settings import Settings
from . import stream_text


class EchoEngine:
    counts_cancellations = False

    def __init__(self, settings: Settings) -> None:
        self.context_window = settings.max_context_tokens
        self._engine = WordEcho(
            context_window=settings.max_context_tokens,
            tokens_per_s=settings.echo_tokens_per_s,
            tokenizer="words",
        )

    def load(self) -> None:
        self._engine.load()

    def count_prompt(self, generation: Generation) -> int:
        """The words of every message (the echo reads them all, though it repeats the last)."""
        said = sum(len(self._engine.encode(content)) for _, content in generation.messages)
        return said + len(self._engine.encode(generation.prefix))

    def stream(self, generation: Generation) -> AsyncIterator[str]:
        said = " ".join(generation.last_user_message.split())  # word by word, one space between
        prompt = self._engine.chat_prompt([{"role": "user", "content": said}])
        done = len(self._engine.encode(generation.prefix))  # a continued reply: the words it has already
        return stream_text(self._engine, prompt[done:], generation)

    def stats(self) -> dict[str, int]:
        return {"active": self._engine.active, "tokens": self._engine.tokens}

    def current_load(self) -> EngineLoad:
        """No slots: every reply streams at once; each has the words it will still send."""
        return self._engine.current_load()

    async def close(self) -> None:
        await self._engine.close()
