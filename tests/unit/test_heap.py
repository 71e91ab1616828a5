"""The controller's heap keeper: it freezes once the deployments settled, not while they
change, at most once per min_interval_s under churn, and a full freeze every
max_interval_s frees the cyclic garbage the others kept."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from app_toolkit._runtime.controller import heap
from app_toolkit._runtime.controller.heap import HeapKeeper


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_it_freezes_once_nothing_changed_for_settle_s() -> None:
    keeper = HeapKeeper(settle_s=5, min_interval_s=10, max_interval_s=600)
    keeper.changed()
    assert not keeper.tick(100.0)  # just changed
    keeper.changed()
    assert not keeper.tick(104.0)  # changed again: settling starts over
    assert not keeper.tick(108.9)
    assert keeper.tick(109.0)
    assert gc.get_freeze_count() > 0 and (keeper.freezes, keeper.full_freezes) == (1, 1)
    assert not keeper.tick(110.0) and not keeper.tick(500.0)  # nothing changed since


class _CountingGC:
    """Stands in for ``gc`` where only when the keeper freezes matters: ~130 real
    collections of the test session's heap take half a minute."""

    def __init__(self) -> None:
        self.collections = 0

    def collect(self) -> int:
        self.collections += 1
        return 0

    def freeze(self) -> None: ...

    def unfreeze(self) -> None: ...

    def get_freeze_count(self) -> int:
        return 0


def test_under_churn_it_freezes_at_most_once_per_min_interval_and_fully_once_per_max(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counting = _CountingGC()
    monkeypatch.setattr(heap, "gc", counting)
    keeper = HeapKeeper(settle_s=1, min_interval_s=10, max_interval_s=600)
    frozen: list[float] = []
    for second in range(0, 1300):
        if second % 3 == 0:
            keeper.changed()  # a replica replaced every 3 s
        if keeper.tick(second + 0.5):
            frozen.append(second + 0.5)
    gaps = [later - earlier for earlier, later in zip(frozen, frozen[1:], strict=False)]
    assert keeper.full_freezes == 3  # at the start, then every 600 s: the only long pauses
    assert len([gap for gap in gaps if gap < 10]) <= 2  # only a full freeze comes sooner
    assert 100 <= len(frozen) <= 1300 / 10 + 3  # not at every settled moment
    assert counting.collections == len(frozen)  # one collection per freeze, none between


def test_cyclic_garbage_kept_by_a_freeze_goes_at_the_next_full_one() -> None:
    keeper = HeapKeeper(settle_s=1, min_interval_s=10, max_interval_s=100)
    node = _Node()
    gone = weakref.ref(node)
    keeper.tick(0.0)
    assert keeper.tick(1.0)  # the node is frozen with the rest
    del node
    gc.collect()
    assert gone() is not None  # out of the collector's reach: kept
    keeper.changed()
    keeper.tick(20.0)
    assert keeper.tick(21.0) and keeper.full_freezes == 1  # a freeze of the new objects only
    assert gone() is not None
    assert keeper.tick(101.0) and keeper.full_freezes == 2  # the full one collects first
    assert gone() is None
