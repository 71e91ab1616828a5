"""Model backends. Each turns a :class:`~..schemas.Generation` into a stream of text pieces.

The local and echo backends wrap the toolkit's engines (``app_toolkit.llm``'s),
which work in token ids: :func:`stream_text` turns their tokens into text pieces.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Protocol

from app_toolkit.llm import Detokenizer, EngineRequest, Sampling, TextEngine

from ..scaling import EngineLoad
from ..schemas import Generation
from ..settings import Settings

#: Prompt tokens decoded with a reply's first tokens, so a tokenizer that drops a leading
#: space at the start of a text keeps it.
CONTEXT_TOKENS = 5


class Engine(Protocol):
    """What the model deployment needs from a backend."""

    context_window: int
    #: It records the replies cancelled before their first token itself, by stage (the local
    #: decoder tells queued from prefill); the model deployment records the others.
    counts_cancellations: bool

    def load(self) -> None:
        """Load the model (once per replica, in its constructor)."""

    def count_prompt(self, generation: Generation) -> int:
        """Tokens the conversation takes (an estimate where the backend cannot count)."""

    def stream(self, generation: Generation) -> AsyncIterator[str]:
        """The reply, piece by piece. Closing the iterator stops the generation."""

    def stats(self) -> dict[str, int]:
        """Counters for operators and tests: ``active`` replies and ``tokens`` produced."""

    def current_load(self) -> EngineLoad:
        """What it holds now, for the pool's autoscaling (scaling.py); cheap, never waits."""

    async def close(self) -> None:
        """Free the model or connection."""


async def stream_text(
    engine: TextEngine, prompt: list[int], generation: Generation, repetition_penalty: float = 1.0
) -> AsyncIterator[str]:
    """The text of the reply ``engine`` makes to ``prompt``, as it is decoded: one piece per
    token that completes some text (a token ending in half a character waits for the
    rest). Closing the iterator takes the reply out of the engine's batch at once.
    ``repetition_penalty``: how much less likely a token already seen becomes (1: none)."""
    detokenizer = Detokenizer(engine.decode, context=prompt[-CONTEXT_TOKENS:])
    sampling = Sampling(
        max_tokens=generation.max_tokens,
        temperature=generation.temperature,
        top_p=generation.top_p,
        repetition_penalty=repetition_penalty,
    )
    # The engines' generate is an async generator function's: it has aclose().
    async with aclosing(engine.generate(EngineRequest(prompt, sampling))) as tokens:
        async for token in tokens:
            if token.ends:  # the end of sequence: not text
                break
            piece = detokenizer.feed(token.id)
            if piece:
                yield piece
        tail = detokenizer.flush()
        if tail:
            yield tail


def make_engine(settings: Settings) -> Engine:
    """The backend ``settings.backend`` names (imported only when chosen)."""
    if settings.backend == "echo":
        from .echo import EchoEngine

        return EchoEngine(settings)
    if settings.backend == "openai":
        from .upstream import UpstreamEngine

        return UpstreamEngine(settings)
    from .local import LocalEngine

    return LocalEngine(settings)
