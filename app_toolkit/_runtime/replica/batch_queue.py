"""The batching queue: when a batch is ready and which items it takes.

Pure: no I/O and no clock of its own (callers pass ``now``), so it is tested with a fake
clock. ``app_toolkit.batching`` runs it on an event loop.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field


@dataclass(eq=False)
class Pending:
    """One caller's item waiting for (or inside) a batch."""

    value: object  # the caller's item, handed to the user's function as it is
    enqueued_at: float
    #: The multiplexed model it asks for: a batch runs as one call per model (by_group).
    group: str = ""
    size: int = 1
    started: bool = False
    cancelled: bool = False
    future: asyncio.Future[object] | None = None
    #: A streaming caller's results: ("item", result), ("error", exception) or ("end", None).
    stream: asyncio.Queue[tuple[str, object]] | None = None
    batch_task: asyncio.Task[None] | None = None
    finished: bool = False


@dataclass
class BatchQueue:
    """When to flush and what to take; no I/O and no clock of its own (callers pass now)."""

    max_batch_size: int
    batch_wait_timeout_s: float
    items: collections.deque[Pending] = field(default_factory=collections.deque)

    def add(self, pending: Pending) -> None:
        self.items.append(pending)

    def remove(self, pending: Pending) -> None:
        try:
            self.items.remove(pending)
        except ValueError:
            pass

    def __len__(self) -> int:
        return len(self.items)

    def flush_at(self) -> float | None:
        """When the oldest item's wait runs out (None if empty)."""
        if not self.items:
            return None
        return self.items[0].enqueued_at + self.batch_wait_timeout_s

    def is_full(self) -> bool:
        """max_batch_size units are waiting (of any models: Ray Serve fills a batch, then
        splits it by model)."""
        return sum(item.size for item in self.items) >= self.max_batch_size

    def ready(self, now: float) -> bool:
        flush_at = self.flush_at()
        return flush_at is not None and (self.is_full() or now >= flush_at)

    def take(self) -> list[Pending]:
        """The next batch: the oldest items within max_batch_size (an oversized item goes
        alone); the rest keep their order."""
        batch: list[Pending] = []
        total = 0
        while self.items and (not batch or total + self.items[0].size <= self.max_batch_size):
            item = self.items.popleft()
            batch.append(item)
            total += item.size
        return batch


def by_group(batch: list[Pending]) -> list[list[Pending]]:
    """``batch`` split into one sub-batch per group (multiplexed model), in the order
    each group first appears, each keeping its items' order (Ray Serve's split)."""
    groups: dict[str, list[Pending]] = {}
    for item in batch:
        groups.setdefault(item.group, []).append(item)
    return list(groups.values())
