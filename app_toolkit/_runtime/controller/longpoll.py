"""Versioned values that callers wait on: how the controller pushes tables out.

A caller sends the versions it already has; the call returns as soon as any of those keys
holds a newer value (or after ``timeout_s`` with nothing). Keys never published have
version 0 and no table, so a caller that starts with version -1 gets them at once.
Versions count on from the microseconds since the epoch when the host was made, so a
restarted controller's tables have larger versions than its predecessor's: a caller's
"do you hold version N or later?" stays true to its word across restarts.

Every publish wakes every waiting call. A woken call looks only at the keys published
since it last looked (a bounded log of recent publishes), not at every key it holds: with
hundreds of callers each following a thousand tables, a publish costs each of them the
size of the change, not the size of its table set.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Iterable

from app_toolkit._runtime.tables import Table, Update, Updates, Versions
from app_toolkit._runtime.waiting import wait_event

_NEVER_PUBLISHED = Update(0, None)
#: Publishes remembered by key; a call that slept through more looks at every key.
LOG_SIZE = 4096


class LongPollHost:
    """Holds the published tables; lives inside the controller."""

    def __init__(self, log_size: int = LOG_SIZE, first_version: int | None = None) -> None:
        self._versions: dict[str, int] = {}
        self._first_version = time.time_ns() // 1000 if first_version is None else first_version
        self._values: dict[str, Table] = {}
        self._sent: dict[str, Update] = {}  # what callers get of each key (packed once)
        self._changed = asyncio.Event()
        #: Counts the tables published; callers of ``snapshot`` compare it to skip copies.
        self.generation = 0
        self._log: deque[str] = deque(maxlen=log_size)  # the key of each recent publish

    def publish(self, key: str, value: Table) -> None:
        if key in self._values and self._values[key] == value:
            return
        version = self._versions[key] = self._versions.get(key, self._first_version) + 1
        self._values[key] = value
        self._sent[key] = Update.packed(version, value)
        self.generation += 1
        self._log.append(key)
        self._changed.set()
        self._changed = asyncio.Event()

    def get(self, key: str) -> Table | None:
        return self._values.get(key)

    def version(self, key: str) -> int:
        """The version of ``key``'s current table (0: never published)."""
        return self._versions.get(key, 0)

    def snapshot(self) -> dict[str, Table]:
        """Every key's current table (a copy of the mapping; tables are immutable)."""
        return dict(self._values)

    def published_since(self, generation: int) -> set[str] | None:
        """The keys published after ``generation``; None if the log no longer reaches
        back that far."""
        behind = self.generation - generation
        if behind > len(self._log):
            return None
        return set(itertools.islice(reversed(self._log), behind))

    def _updates(self, known: Versions, keys: Iterable[str] | None = None) -> Updates:
        """The newer values among ``known``, looking at ``keys`` only if given."""
        versions = self._versions
        if keys is None:
            keys = known
        return {
            key: self._sent.get(key, _NEVER_PUBLISHED)
            for key in keys
            if key in known and versions.get(key, 0) != known[key]
        }

    async def listen(self, known: Versions, timeout_s: float) -> Updates:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        seen = self.generation
        updates = self._updates(known)
        while not updates:
            remaining = deadline - loop.time()
            if remaining <= 0 or not await wait_event(self._changed, remaining):
                return {}
            updates = self._updates(known, self.published_since(seen))
            seen = self.generation
        return updates
