"""The pure replica chooser: power of two choices, capacity, back-off."""

from __future__ import annotations

import random

from app_toolkit._runtime.messages import DeploymentID, ReplicaInfo
from app_toolkit._runtime.routing.choice import QUEUE_CAP, ReplicaChooser, queue_is_full

DEP = DeploymentID("app", "d")


def info(replica_id: str, capacity: int = 2) -> ReplicaInfo:
    return ReplicaInfo(replica_id, DEP, "127.0.0.1", 1, b"t", capacity)


def test_prefers_the_less_loaded_of_two() -> None:
    chooser = ReplicaChooser(random.Random(0))
    chooser.set_replicas([info("a", 10), info("b", 10)])
    chooser.acquire("a")
    chooser.acquire("a")
    assert all(chooser.choose(0.0).replica_id == "b" for _ in range(20))  # type: ignore[union-attr]


def test_spreads_load_over_replicas() -> None:
    chooser = ReplicaChooser(random.Random(1))
    chooser.set_replicas([info(name, 100) for name in "abcd"])
    for _ in range(200):
        chosen = chooser.choose(0.0)
        assert chosen is not None
        chooser.acquire(chosen.replica_id)
    counts = [chooser.in_flight(name) for name in "abcd"]
    assert sum(counts) == 200 and max(counts) - min(counts) <= 2


def test_never_exceeds_capacity() -> None:
    chooser = ReplicaChooser()
    chooser.set_replicas([info("a", 1), info("b", 1)])
    for _ in range(2):
        chosen = chooser.choose(0.0)
        assert chosen is not None
        chooser.acquire(chosen.replica_id)
    assert chooser.choose(0.0) is None
    chooser.release("b")
    assert chooser.choose(0.0).replica_id == "b"  # type: ignore[union-attr]


def test_counts_survive_table_updates_and_removed_replicas_vanish() -> None:
    chooser = ReplicaChooser()
    chooser.set_replicas([info("a"), info("b")])
    chooser.acquire("a")
    chooser.set_replicas([info("a"), info("c")])
    assert chooser.in_flight("a") == 1
    assert sorted(chooser.replica_ids) == ["a", "c"]
    chooser.remove("a")
    assert chooser.replica_ids == ["c"]
    chooser.release("a")  # releasing a forgotten replica is harmless


def test_rejecting_replica_is_skipped_with_growing_backoff() -> None:
    chooser = ReplicaChooser()
    chooser.set_replicas([info("a")])
    first = chooser.rejected("a", now=10.0)
    assert chooser.choose(10.0) is None
    assert chooser.choose(10.0 + first) is not None
    second = chooser.rejected("a", now=20.0)
    assert second == 2 * first
    chooser.succeeded("a")
    assert chooser.rejected("a", now=30.0) == first
    for _ in range(20):
        assert chooser.rejected("a", now=40.0) <= 0.1


def test_queue_bound() -> None:
    assert not queue_is_full(0, 1)
    assert queue_is_full(1, 1)
    assert queue_is_full(0, 0)
    # -1 (Ray Serve's "no bound") is a fixed cap.
    assert not queue_is_full(QUEUE_CAP - 1, -1) and queue_is_full(QUEUE_CAP, -1)
