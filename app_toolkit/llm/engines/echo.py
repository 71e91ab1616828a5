"""A deterministic engine with no model, for tests and load tests: the reply repeats the
last user message, byte by byte, at a steady pace.

Its tokenizer is bytes: a token id is one byte of the UTF-8 text (0-255), and
:data:`EOS_ID` ends a sequence. Replies go through the same path as a model's (token ids,
detokenizing, stop strings, constraints), so what a test sees is what a model would
produce with this tokenizer.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from ..engine import Constraint, EngineLoad, Sampling

#: The end-of-sequence token: after the 256 byte values.
EOS_ID = 256
#: Token ids run from 0 to EOS_ID.
VOCAB_SIZE = EOS_ID + 1


class EchoEngine:
    """Repeats the prompt's tokens at ``tokens_per_s`` (every reply at once: no slots).

    ``generate`` echoes the prompt it is given; ``chat_prompt`` gives the last user
    message's bytes, so a chat reply repeats what the user said. With ``ignore_eos`` the
    prompt repeats until ``max_tokens``.
    """

    slots = 0
    tokenizer: Any = None  # bytes need no Hugging Face tokenizer
    eos_token_ids = frozenset({EOS_ID})

    def __init__(self, context_window: int = 2048, tokens_per_s: float = 1000.0) -> None:
        if context_window < 1:
            raise ValueError(f"context_window must be >= 1, got {context_window}")
        if tokens_per_s <= 0:
            raise ValueError(f"tokens_per_s must be > 0, got {tokens_per_s}")
        self.context_window = context_window
        self.tokens_per_s = tokens_per_s
        self._remaining: dict[int, int] = {}  # per reply under way: tokens it may still produce
        self.tokens = 0  # produced since the start, for tests and stats

    def load(self) -> None:
        """Nothing to load."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The UTF-8 bytes of ``text`` (there are no special tokens to add)."""
        return list(text.encode())

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of the byte tokens (the end-of-sequence token skipped; a cut
        character shows as U+FFFD)."""
        return bytes(token for token in token_ids if token < EOS_ID).decode(errors="replace")

    def chat_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """The last user message's bytes (the rest of the conversation is not echoed)."""
        said = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
        return self.encode(str(said))

    async def generate(
        self, prompt: list[int], sampling: Sampling, constraint: Constraint | None = None
    ) -> AsyncIterator[int]:
        """The prompt's tokens back, one every ``1 / tokens_per_s`` seconds on a fixed
        schedule (a late token does not delay the next ones).

        A token the constraint does not allow is replaced by the lowest one it does (none
        allowed ends the reply). A stop or end-of-sequence token ends the reply unsent; so
        does the prompt's end.
        """
        key = object()
        self._remaining[id(key)] = sampling.max_tokens
        try:
            loop = asyncio.get_running_loop()
            interval = 1.0 / self.tokens_per_s
            due = loop.time()
            for produced, echoed in enumerate(self._echoed(prompt, sampling), start=1):
                if produced > sampling.max_tokens:
                    return
                due += interval
                await asyncio.sleep(max(0.0, due - loop.time()))
                token = echoed if constraint is None else _allowed(echoed, constraint)
                if token is None or token in sampling.stop_token_ids:
                    return
                if token == EOS_ID and not sampling.ignore_eos:
                    return
                if constraint is not None:
                    constraint.accept(token)
                self.tokens += 1
                self._remaining[id(key)] -= 1
                yield token
                if constraint is not None and constraint.finished:
                    return
        finally:
            del self._remaining[id(key)]

    @staticmethod
    def _echoed(prompt: list[int], sampling: Sampling) -> Iterator[int]:
        """The prompt (again and again with ignore_eos); its end ends the reply, whatever a
        constraint allows."""
        if sampling.ignore_eos and prompt:
            return itertools.cycle(prompt)
        return iter(prompt)

    def current_load(self) -> EngineLoad:
        """No slots: every reply streams at once; each has the tokens it may still produce."""
        return EngineLoad(slots=0, running=tuple(self._remaining.values()))

    async def close(self) -> None:
        """Nothing to free."""


def _allowed(token: int, constraint: Constraint) -> int | None:
    """``token`` if the constraint allows it, else the lowest id it allows (None: none)."""
    mask = constraint.allowed(VOCAB_SIZE)
    if bool(mask[token]):
        return token
    return next((candidate for candidate in range(VOCAB_SIZE) if bool(mask[candidate])), None)
