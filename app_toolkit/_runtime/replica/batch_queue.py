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
    #: Items batch only with items of their group: the multiplexed model they ask for.
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
        """The next batch (the oldest item's group) has max_batch_size units waiting."""
        if not self.items:
            return False
        group = self.items[0].group
        return sum(item.size for item in self.items if item.group == group) >= self.max_batch_size

    def ready(self, now: float) -> bool:
        flush_at = self.flush_at()
        return flush_at is not None and (self.is_full() or now >= flush_at)

    def take(self) -> list[Pending]:
        """The next batch: items of the oldest item's group, oldest first, within
        max_batch_size (an oversized item goes alone); other groups keep their places."""
        if not self.items:
            return []
        group = self.items[0].group
        batch: list[Pending] = []
        kept: collections.deque[Pending] = collections.deque()
        total = 0
        while self.items:
            item = self.items.popleft()
            if item.group != group or (batch and total + item.size > self.max_batch_size):
                kept.append(item)
                if item.group == group:
                    break  # the batch is full: the rest keeps its order
                continue
            batch.append(item)
            total += item.size
        kept.extend(self.items)
        self.items = kept
        return batch
