"""Versioned values that callers wait on: how the controller pushes tables out.

A caller sends the versions it already has; the call returns as soon as any of those keys
holds a newer value (or after ``timeout_s`` with nothing). Keys never published have
version 0 and no table, so a caller that starts with version -1 gets them at once.
"""

from __future__ import annotations

import asyncio

from app_toolkit._runtime.tables import Table, Update, Updates, Versions
from app_toolkit._runtime.waiting import wait_event


class LongPollHost:
    """Holds the published tables; lives inside the controller."""

    def __init__(self) -> None:
        self._versions: dict[str, int] = {}
        self._values: dict[str, Table] = {}
        self._changed = asyncio.Event()
        #: Counts the tables published; callers of ``snapshot`` compare it to skip copies.
        self.generation = 0

    def publish(self, key: str, value: Table) -> None:
        if key in self._values and self._values[key] == value:
            return
        self._versions[key] = self._versions.get(key, 0) + 1
        self._values[key] = value
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def get(self, key: str) -> Table | None:
        return self._values.get(key)

    def snapshot(self) -> dict[str, Table]:
        """Every key's current table (a copy of the mapping; tables are immutable)."""
        return dict(self._values)

    def _updates(self, known: Versions) -> Updates:
        return {
            key: Update(self._versions.get(key, 0), self._values.get(key))
            for key, version in known.items()
            if self._versions.get(key, 0) != version
        }

    async def listen(self, known: Versions, timeout_s: float) -> Updates:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            updates = self._updates(known)
            if updates:
                return updates
            remaining = deadline - loop.time()
            if remaining <= 0:
                return {}
            if not await wait_event(self._changed, remaining):
                return {}
