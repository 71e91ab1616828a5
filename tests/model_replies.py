"""A model's reply as the ingress reads it, made of given deltas: for tests of the
ingress's shaping (OpenAI's objects and events) without a model deployment."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from app_toolkit.llm.events import Delta


class GivenReply:
    """The deltas as a handle's stream of them (``async for``, ``cancel()``)."""

    def __init__(self, deltas: Sequence[Delta]) -> None:
        self._deltas = list(deltas)

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Delta]:
        for delta in self._deltas:
            yield delta

    def cancel(self) -> None:
        pass
