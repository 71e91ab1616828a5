"""The length of the prefix two sequences share (token ids, or text): what the
prefix-aware router (``prefix_aware.py``) measures, and the LLM engines' prefix cache
(``llm/engines/prefix_cache.py``) with it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

S = TypeVar("S", bound=Sequence[object])


def shared_prefix(held: S, other: S, most: int | None = None) -> int:
    """How many leading items ``held`` and ``other`` (of one type: two strings, two
    tuples) share, at most ``most``. Slices are compared whole (in C), halving the range:
    a few comparisons, not one per item."""
    most = min(len(held), len(other), len(held) if most is None else most)
    if held[:most] == other[:most]:
        return most
    low, high = 0, most  # held[:low] matches; held[:high] does not
    while high - low > 1:
        middle = (low + high) // 2
        if held[:middle] == other[:middle]:
            low = middle
        else:
            high = middle
    return low
