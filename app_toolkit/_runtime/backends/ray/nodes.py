"""The cluster's nodes as the toolkit's Ray backend sees them: which are alive and which
are leaving (Ray drains them: ``ray start --block`` on SIGTERM, the autoscaler scaling
down, a preemption notice, ``ray drain-node``), read from the GCS without the dashboard.

One watch is read by the proxy fleet, the spare pool and the controller's backend, and
asks the GCS at most once per ``_FRESH_S``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import ray

from app_toolkit._runtime.backends.ray import ray_compat

logger = logging.getLogger("app_toolkit.ray")

#: A reading younger than this is reused.
_FRESH_S = 0.5
_GCS_TIMEOUT_S = 5


def _read(known: dict[str, float]) -> tuple[set[str], dict[str, float]]:
    """Alive nodes, and the leaving ones among them (``known``: the last reading, kept
    for the nodes still alive when the GCS does not answer)."""
    alive = {str(node["NodeID"]) for node in ray.nodes() if node["Alive"]}  # type: ignore[no-untyped-call]
    try:
        draining = {
            node: (deadline / 1000 if deadline else math.inf)
            for node, deadline in ray_compat.draining_nodes(_GCS_TIMEOUT_S).items()
        }
    except Exception as exc:  # noqa: BLE001 - a hiccup: what was known stays so
        logger.warning("Could not read which nodes are leaving (%s); keeping the last reading", exc)
        draining = known
    return alive, {node: deadline for node, deadline in draining.items() if node in alive}


class NodeWatch:
    """Alive and leaving nodes, refreshed when read (at most every ``_FRESH_S``)."""

    def __init__(self) -> None:
        self.alive: set[str] = set()
        #: Node id -> when it goes (Unix time; ``inf``: no deadline).
        self.draining: dict[str, float] = {}
        self._read_at = -math.inf
        self._reading: asyncio.Lock | None = None

    async def refresh(self) -> NodeWatch:
        """This watch, read from the GCS unless read a moment ago."""
        if self._reading is None:
            self._reading = asyncio.Lock()
        async with self._reading:
            if time.monotonic() - self._read_at >= _FRESH_S:
                self.alive, self.draining = await asyncio.to_thread(_read, self.draining)
                self._read_at = time.monotonic()
        return self

    @property
    def serving(self) -> set[str]:
        """Nodes that are alive and not leaving: where new replicas, spares and proxies go."""
        return self.alive - self.draining.keys()

    def seconds_left(self) -> dict[str, float]:
        """Leaving node -> seconds until it goes (``inf``: no deadline)."""
        now = time.time()
        return {node: max(deadline - now, 0.0) for node, deadline in self.draining.items()}
