"""Versioned values that callers wait on: how the controller pushes tables out.

A caller sends the versions it already has; the call returns as soon as any of those keys
holds a newer value (or after ``timeout_s`` with nothing). Keys never published have
version 0 and value None, so a caller that starts with version -1 gets them at once.
"""

from __future__ import annotations

import asyncio
from typing import Any


class LongPollHost:
    """Holds the published values; lives inside the controller."""

    def __init__(self) -> None:
        self._versions: dict[str, int] = {}
        self._values: dict[str, Any] = {}
        self._changed = asyncio.Event()

    def publish(self, key: str, value: Any) -> None:
        if key in self._values and self._values[key] == value:
            return
        self._versions[key] = self._versions.get(key, 0) + 1
        self._values[key] = value
        self._changed.set()
        self._changed = asyncio.Event()

    def get(self, key: str) -> Any:
        return self._values.get(key)

    def _updates(self, known: dict[str, int]) -> dict[str, tuple[int, Any]]:
        return {
            key: (self._versions.get(key, 0), self._values.get(key))
            for key, version in known.items()
            if self._versions.get(key, 0) != version
        }

    async def listen(self, known: dict[str, int], timeout_s: float) -> dict[str, tuple[int, Any]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            updates = self._updates(known)
            if updates:
                return updates
            remaining = deadline - loop.time()
            if remaining <= 0:
                return {}
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                return {}


def replicas_key(deployment: object) -> str:
    """The long-poll key of one deployment's replica table."""
    return f"replicas:{deployment}"


ROUTES_KEY = "routes"
