"""In-process metrics: histograms kept per replica process.

Recording never raises and never blocks; an exporter (Prometheus / HTTP) reads
:func:`snapshot`. Names follow Prometheus conventions (``_seconds``, ``_size``).
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

#: Bucket upper bounds for sizes (items) and for waits (seconds).
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class Histogram:
    """Counts of observations per bucket (cumulative on read), with their sum."""

    name: str
    labels: tuple[tuple[str, str], ...]
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)  # the last bucket is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.count += 1
        self.total += value

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def to_dict(self) -> dict[str, Any]:
        cumulative, running = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return {
            "name": self.name,
            "labels": dict(self.labels),
            "count": self.count,
            "sum": self.total,
            "mean": self.mean,
            "buckets": cumulative,
        }


_lock = threading.Lock()
_histograms: dict[tuple[str, tuple[tuple[str, str], ...]], Histogram] = {}


def histogram(name: str, buckets: tuple[float, ...], **labels: str) -> Histogram:
    """The process-wide histogram of ``name`` with these labels (created on first use)."""
    key = (name, tuple(sorted(labels.items())))
    with _lock:
        found = _histograms.get(key)
        if found is None:
            found = _histograms[key] = Histogram(name, key[1], buckets)
        return found


def snapshot() -> list[dict[str, Any]]:
    """Every histogram of this process, as plain data."""
    with _lock:
        return [h.to_dict() for h in _histograms.values()]
