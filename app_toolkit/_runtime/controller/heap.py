"""Short garbage collections in the controller's process.

The controller keeps a few long-lived objects per replica (its state, its info, their
tuples and dicts): about 105,000 at 10,000 replicas, which every full collection of
CPython's collector walks, 60 to 140 ms each on a small machine, several times a minute.
Once the deployments have settled (nothing started or stopped for ``settle_s``),
:class:`HeapKeeper` collects what is garbage among the objects made since the last
freeze and moves the rest out of the collector's reach (``gc.freeze()``); collections
then walk only the objects made after, a few thousand. Such a freeze walks only what is
not frozen yet, so it is short too; it happens after a settled change, at most every
``min_interval_s``.

What it costs: a frozen object that becomes unreachable is still freed at once by
reference counting; only one held in a reference cycle stays until the next *full*
freeze, which unfreezes everything, collects and freezes again: one full collection
every ``max_interval_s`` (ten minutes), when the deployments are settled. So what is
kept is at most the cyclic garbage of ``max_interval_s`` of changes.
"""

from __future__ import annotations

import gc
import logging
import time

logger = logging.getLogger(__name__)


class HeapKeeper:
    """Decides when to freeze the process's heap; call :meth:`tick` once a pass."""

    def __init__(
        self, *, settle_s: float = 5.0, min_interval_s: float = 10.0, max_interval_s: float = 600.0
    ) -> None:
        self.settle_s = settle_s
        self.min_interval_s = min_interval_s
        self.max_interval_s = max_interval_s
        self.freezes = 0
        self.full_freezes = 0
        self.last_pause_s = 0.0
        self._changes = 0  # changes counted so far (starts, stops)
        self._seen = -1  # ``_changes`` at the last tick that saw them change
        self._changed_at = 0.0
        self._frozen_at: float | None = None
        self._frozen_changes = -1  # ``_changes`` at the last freeze
        self._full_at: float | None = None

    def changed(self) -> None:
        """Something that adds or drops long-lived objects happened (a replica started or
        stopped, so an application deployed, scaled or was deleted)."""
        self._changes += 1

    def tick(self, now: float) -> bool:
        """Freeze if it is time to; True if it did."""
        if self._changes != self._seen:
            self._seen, self._changed_at = self._changes, now
        if now - self._changed_at < self.settle_s:
            return False  # still changing: what is alive now may be gone in a moment
        full = self._full_at is None or now - self._full_at >= self.max_interval_s
        if not full:
            assert self._frozen_at is not None
            if self._changes == self._frozen_changes or now - self._frozen_at < self.min_interval_s:
                return False
        started = time.perf_counter()
        if full:
            gc.unfreeze()  # the cyclic garbage frozen objects left goes in this collection
        gc.collect()
        gc.freeze()
        self.last_pause_s = time.perf_counter() - started
        self._frozen_at, self._frozen_changes = now, self._changes
        self.freezes += 1
        if full:
            self._full_at = now
            self.full_freezes += 1
        logger.debug(
            "Heap frozen (%s): %d objects, %.1f ms",
            "full" if full else "new objects",
            gc.get_freeze_count(),
            1000 * self.last_pause_s,
        )
        return True
