"""A deterministic backend: the reply repeats the last user message, word by word, at a
fixed pace. For tests and load tests: no model, same streaming path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ..scaling import EngineLoad
from ..schemas import Generation
from ..settings import Settings


class EchoEngine:
    counts_cancellations = False

    def __init__(self, settings: Settings) -> None:
        self.context_window = settings.max_context_tokens
        self._interval_s = 1.0 / settings.echo_tokens_per_s
        self._active = 0
        self._tokens = 0
        self._remaining: dict[int, int] = {}  # words each reply under way has still to send

    def load(self) -> None:
        return None

    def count_prompt(self, generation: Generation) -> int:
        said = sum(len(content.split()) for _, content in generation.messages)
        return said + len(generation.prefix.split())

    async def stream(self, generation: Generation) -> AsyncIterator[str]:
        words = generation.last_user_message.split()
        done = len(generation.prefix.split())  # a continued reply: the words it has already
        sending = words[done : done + generation.max_tokens]
        key = id(sending)
        self._remaining[key] = len(sending)
        self._active += 1
        try:
            loop = asyncio.get_running_loop()
            due = loop.time()
            for index, word in enumerate(sending, start=done):
                due += self._interval_s
                await asyncio.sleep(max(0.0, due - loop.time()))  # a steady pace, not a drifting one
                self._tokens += 1
                self._remaining[key] -= 1
                yield word if index == len(words) - 1 else word + " "
        finally:
            self._active -= 1
            del self._remaining[key]

    def stats(self) -> dict[str, int]:
        return {"active": self._active, "tokens": self._tokens}

    def current_load(self) -> EngineLoad:
        """No slots: every reply streams at once; each has its words left to send."""
        return EngineLoad(slots=0, running=tuple(self._remaining.values()))

    async def close(self) -> None:
        return None
