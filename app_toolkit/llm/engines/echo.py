"""A deterministic engine with no model, for tests and load tests: the reply repeats the
last user message, token by token, at a steady pace.

Its tokenizer is bytes by default: a token id is one byte of the UTF-8 text (0-255), and
:data:`EOS_ID` ends a sequence. With ``tokenizer="words"`` a token is a word with the
spaces after it (ids given as words are first seen, from 1; 0 ends a sequence), so
counts read as words (the chat example's tests and load tests). Replies go through the
same path as a model's (token ids, detokenizing, stop strings, constraints), so what a
test sees is what a model would produce with this tokenizer.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from typing import Literal

from ..engine import (
    Adapters,
    Capabilities,
    Constraint,
    EngineLoad,
    EngineRequest,
    EngineStopped,
    Logprobs,
    Sampling,
    Token,
)

#: The end-of-sequence token of the bytes tokenizer: after the 256 byte values.
EOS_ID = 256
#: The bytes tokenizer's ids run from 0 to EOS_ID.
VOCAB_SIZE = EOS_ID + 1
#: A word token: a word and the spaces after it (or the spaces a text starts with).
_WORD = re.compile(r"\S+\s*|\s+")


class _Bytes:
    eos_token_id = EOS_ID
    vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(token for token in token_ids if 0 <= token < EOS_ID).decode(errors="replace")


class _Words:
    """Ids given to words as they are first seen (the vocabulary grows with the texts)."""

    eos_token_id = 0

    def __init__(self) -> None:
        self._words = [""]  # id 0: the end of a sequence
        self._ids: dict[str, int] = {}

    @property
    def vocab_size(self) -> int:
        return len(self._words)

    def encode(self, text: str) -> list[int]:
        return [self._ids.get(word) or self._add(word) for word in _WORD.findall(text)]

    def _add(self, word: str) -> int:
        self._ids[word] = len(self._words)
        self._words.append(word)
        return self._ids[word]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(self._words[token] for token in token_ids if 0 < token < len(self._words))


class EchoEngine:
    """Repeats the prompt's tokens at ``tokens_per_s`` (every reply at once: no slots).

    ``generate`` echoes the prompt it is given; ``chat_prompt`` gives the last user
    message's tokens, so a chat reply repeats what the user said. With ``ignore_eos`` the
    prompt repeats until ``max_tokens``.
    """

    #: The engine's name, as the start-up log and ``/v1/models`` give it.
    name = "echo"
    task: Literal["generate"] = "generate"
    #: No model: every token certain (log-probability 0); a continued reply echoes on from
    #: where it was; no adapters.
    capabilities = Capabilities(logprobs=True, structured="masks", continuation="all")
    adapters: Adapters | None = None

    slots = 0
    tokenizer: None = None  # bytes and words need no Hugging Face tokenizer

    def __init__(
        self,
        context_window: int = 2048,
        tokens_per_s: float = 1000.0,
        tokenizer: Literal["bytes", "words"] = "bytes",
    ) -> None:
        if context_window < 1:
            raise ValueError(f"context_window must be >= 1, got {context_window}")
        if tokens_per_s <= 0:
            raise ValueError(f"tokens_per_s must be > 0, got {tokens_per_s}")
        if tokenizer not in ("bytes", "words"):
            raise ValueError(f"tokenizer {tokenizer!r} is not one of bytes, words")
        self.context_window = context_window
        self.tokens_per_s = tokens_per_s
        self._tokens = _Bytes() if tokenizer == "bytes" else _Words()
        self.eos_token_ids = frozenset({self._tokens.eos_token_id})
        self._remaining: dict[int, int] = {}  # per reply under way: tokens it may still produce
        self.tokens = 0  # produced since the start, for tests and stats
        self._closed = False

    def load(self) -> None:
        """Nothing to load."""

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to this less one (words: as many as seen so far)."""
        return self._tokens.vocab_size

    @property
    def active(self) -> int:
        """Replies under way."""
        return len(self._remaining)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The tokens of ``text`` (there are no special tokens to add)."""
        return self._tokens.encode(text)

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of the tokens (the end-of-sequence token has none, skipped or kept: it
        is the only special token; with bytes, a cut character shows as U+FFFD)."""
        return self._tokens.decode(token_ids)

    def added_tokens(self) -> Mapping[int, str]:
        """None: its vocabulary is bytes or words, with nothing added."""
        return {}

    def token_bytes(self, token_id: int) -> bytes:
        """The token's bytes: one byte (a bytes token), or its word's."""
        if isinstance(self._tokens, _Bytes):
            return bytes([token_id]) if 0 <= token_id < EOS_ID else b""
        return self.decode([token_id]).encode()

    def chat_prompt(
        self,
        messages: Sequence[Mapping[str, object]],
        tools: Sequence[Mapping[str, object]] | None = None,
        template_kwargs: Mapping[str, object] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """The last user message's bytes (the rest of the conversation is not echoed; there
        is no template for ``template_kwargs``, ``add_generation_prompt`` and
        ``continue_final_message`` to change)."""
        said = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
        return self.encode(str(said))

    async def generate(self, request: EngineRequest) -> AsyncGenerator[Token, None]:
        """The prompt's tokens back, one every ``1 / tokens_per_s`` seconds on a fixed
        schedule (a late token does not delay the next ones); a continued reply goes on
        after the tokens it carries.

        A token the constraint does not allow is replaced by the lowest one it does (none
        allowed ends the reply). A stop or end-of-sequence token ends the reply (yielded marked ``ends``); so
        does the prompt's end. There is no model: every token was certain (log-probability
        0, and the only one among the likeliest), whatever the sampling fields say.
        """
        if request.adapter:
            raise ValueError("The echo engine has no model to apply a LoRA adapter to")
        if self._closed:
            raise EngineStopped("The engine has stopped: it takes no more requests")
        prompt, sampling, constraint = request.prompt, request.sampling, request.constraint
        on_slot, on_prompt = request.on_slot, request.on_prompt
        key = object()
        carried = len(request.produced)
        # What it will produce, at most: the prompt's end ends it unless it repeats.
        self._remaining[id(key)] = max(
            0,
            (sampling.max_tokens if sampling.ignore_eos else min(sampling.max_tokens, len(prompt))) - carried,
        )
        if on_slot is not None:
            on_slot()  # no queue: every reply streams at once
        if on_prompt is not None:
            on_prompt(0)  # no model: nothing read, nothing cached
        try:
            loop = asyncio.get_running_loop()
            interval = 1.0 / self.tokens_per_s
            due = loop.time()
            echoes = itertools.islice(self._echoed(prompt, sampling), carried, None)
            for produced, echoed in enumerate(echoes, start=carried + 1):
                if produced > sampling.max_tokens:
                    return
                due += interval
                await asyncio.sleep(max(0.0, due - loop.time()))
                if self._closed:
                    raise EngineStopped("The engine stopped before the reply was complete")
                token = echoed if constraint is None else _allowed(echoed, constraint, self.vocab_size)
                if token is None:
                    return
                if token in sampling.stop_token_ids or (
                    token in self.eos_token_ids and not sampling.ignore_eos
                ):
                    certain = None if sampling.logprobs is None else _certain(token, sampling.logprobs)
                    yield Token(token, certain, ends=True)  # the ending token: counted, not shown
                    return
                if constraint is not None:
                    constraint.accept(token)
                self.tokens += 1
                self._remaining[id(key)] -= 1
                yield Token(token, None if sampling.logprobs is None else _certain(token, sampling.logprobs))
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
        return EngineLoad.of(0, tuple(self._remaining.values()))

    async def check_health(self) -> None:
        """Nothing can fail apart from the replica."""

    async def close(self) -> None:
        """Nothing to free; each reply still open ends with :class:`EngineStopped` where its
        next token was due."""
        self._closed = True


def _certain(token: int, count: int) -> Logprobs:
    """A token with no alternative: log-probability 0, the only one among the likeliest."""
    return Logprobs(0.0, ((token, 0.0),)[:count])


def _allowed(token: int, constraint: Constraint, vocab_size: int) -> int | None:
    """``token`` if the constraint allows it, else the lowest id it allows (None: none)."""
    mask = constraint.allowed(vocab_size)
    if bool(mask[token]):
        return token
    return next((candidate for candidate in range(vocab_size) if bool(mask[candidate])), None)
