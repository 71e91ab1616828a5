"""The percentile the benchmarks quote: the sorted values' element at index
``int(share × n)`` (the last for p100), for every benchmark that quotes one."""

from __future__ import annotations

from collections.abc import Iterable


def percentile(values: Iterable[float], share: float, empty: float = 0.0) -> float:
    """The value at ``share`` (0.5 for p50, 0.99 for p99) of ``values``; ``empty`` if
    there are none."""
    ordered = sorted(values)
    if not ordered:
        return empty
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]
