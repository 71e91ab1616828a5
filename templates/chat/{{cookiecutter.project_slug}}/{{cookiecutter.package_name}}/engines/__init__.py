"""Model backends. Each turns a :class:`~..schemas.Generation` into a stream of text pieces."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from ..scaling import EngineLoad
from ..schemas import Generation
from ..settings import Settings


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
