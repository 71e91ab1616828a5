"""Multiplexing, pure parts: the per-replica model cache and model-aware replica choice."""

from __future__ import annotations

import asyncio
import random

import pytest

import app_toolkit as tk
from app_toolkit import metrics
from app_toolkit._runtime import request_context
from app_toolkit._runtime.messages import DeploymentID, ReplicaInfo
from app_toolkit._runtime.routing.choice import MODEL_HINT_S, ReplicaChooser

pytestmark = pytest.mark.anyio


class Model:
    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True


class Holder:
    def __init__(self) -> None:
        self.loads: list[str] = []
        self.release = asyncio.Event()

    @tk.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str) -> Model:
        self.loads.append(model_id)
        await self.release.wait()
        if model_id == "broken":
            raise RuntimeError("cannot load broken")
        return Model(model_id)


def _counted(name: str, **labels: str) -> float:
    found = metrics.value(name, loader="Holder.get_model", **labels)
    assert not isinstance(found, metrics.HistogramValue)
    return found or 0.0


async def test_concurrent_requests_share_one_load_and_lru_evicts_with_aclose() -> None:
    loads, evictions = (
        _counted("app_toolkit_multiplexed_model_loads_total", outcome="ok"),
        _counted("app_toolkit_multiplexed_model_evictions_total"),
    )
    holder = Holder()
    reports: list[tuple[str, ...]] = []
    request_context.report_models.set(reports.append)
    first = [asyncio.ensure_future(holder.get_model("a")) for _ in range(5)]
    await asyncio.sleep(0)
    holder.release.set()
    models = await asyncio.gather(*first)
    assert holder.loads == ["a"] and all(m is models[0] for m in models)
    b = await holder.get_model("b")
    await holder.get_model("a")  # a is now the most recently used
    await holder.get_model("c")  # evicts b
    await asyncio.sleep(0)
    assert b.closed and not models[0].closed
    assert holder.loads == ["a", "b", "c"]
    assert reports[-1] == ("a", "c")
    assert _counted("app_toolkit_multiplexed_model_loads_total", outcome="ok") == loads + 3
    assert _counted("app_toolkit_multiplexed_model_evictions_total") == evictions + 1


async def test_a_failed_load_fails_every_waiter_and_is_not_cached() -> None:
    failed = _counted("app_toolkit_multiplexed_model_loads_total", outcome="failed")
    holder = Holder()
    waiting = [asyncio.ensure_future(holder.get_model("broken")) for _ in range(3)]
    await asyncio.sleep(0)
    holder.release.set()
    for outcome in await asyncio.gather(*waiting, return_exceptions=True):
        assert isinstance(outcome, RuntimeError) and "cannot load broken" in str(outcome)
    with pytest.raises(RuntimeError):
        await holder.get_model("broken")
    assert holder.loads == ["broken", "broken"]
    assert _counted("app_toolkit_multiplexed_model_loads_total", outcome="failed") == failed + 2


def test_loaders_must_be_async_and_capacity_positive() -> None:
    with pytest.raises(tk.ConfigError, match="needs an async loader"):
        tk.multiplexed(lambda self, model_id: None)  # type: ignore[arg-type, return-value]  # not async, on purpose
    with pytest.raises(tk.ConfigError, match="max_num_models_per_replica must be an integer >= 1"):
        tk.multiplexed(max_num_models_per_replica=0)


def _info(replica_id: str, *models: str) -> ReplicaInfo:
    return ReplicaInfo(replica_id, DeploymentID("a", "D"), "h", 1, b"", 10, models=models)


def test_choice_prefers_holders_then_the_replica_with_fewest_models() -> None:
    chooser = ReplicaChooser(random.Random(1))
    chooser.set_replicas([_info("r1", "m1", "m2"), _info("r2", "m3"), _info("r3")])
    assert all(chooser.choose(0.0, "m3").replica_id == "r2" for _ in range(20))  # type: ignore[union-attr]
    assert all(chooser.choose(0.0, "m9").replica_id == "r3" for _ in range(20))  # type: ignore[union-attr]
    # Sending m9 to r3 makes it a holder for this caller before any table says so.
    chooser.acquire("r3", "m9", now=0.0)
    assert chooser.choose(1.0, "m9").replica_id == "r3"  # type: ignore[union-attr]
    assert chooser.choose(1.0, "m8").replica_id == "r2"  # type: ignore[union-attr] # r3 now has 1 too
    assert chooser.choose(MODEL_HINT_S + 1, "m9").replica_id in {"r2", "r3"}  # type: ignore[union-attr]
    # A holder without a free slot: another replica takes the request.
    for _ in range(10):
        chooser.acquire("r2")
    assert chooser.choose(0.0, "m3").replica_id != "r2"  # type: ignore[union-attr]


def test_hints_stay_bounded_under_random_model_ids() -> None:
    chooser = ReplicaChooser(random.Random(1))
    chooser.set_replicas([_info("r1")])
    for n in range(10_000):  # a client inventing a model id per request
        chooser.acquire("r1", f"junk-{n}", now=float(n))
        chooser.release("r1")
    assert len(chooser._replicas["r1"].sent) <= 256
    assert chooser.choose(10_000.0, "junk-9999").replica_id == "r1"  # type: ignore[union-attr]
