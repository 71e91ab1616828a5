"""A replica's user_config, in process: ``reconfigure`` is called as Ray Serve calls it,
with ``rank=`` when it declares it."""

from __future__ import annotations

import pickle

import pytest

import app_toolkit as tk
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.replica.replica import ReplicaCore
from app_toolkit.config import DeploymentConfig

pytestmark = pytest.mark.anyio


class RankedConfig:
    def __init__(self) -> None:
        self.calls: list[tuple[object, object]] = []

    async def reconfigure(self, user_config: object, rank: tk.ReplicaRank | None = None) -> None:
        self.calls.append((user_config, rank))


class PlainConfig:
    def __init__(self) -> None:
        self.calls: list[object] = []

    def reconfigure(self, user_config: object) -> None:
        self.calls.append(user_config)


async def test_reconfigure_gets_the_rank_when_it_declares_it_as_ray_serve_passes_it() -> None:
    """Declared: called at start without a user_config too, then on each change, with
    rank=; not declared: called only with a user_config, and never given a rank."""
    rank = tk.ReplicaRank(3, 1, 0)
    ranked = ReplicaCore(
        "r1", DeploymentID("a", "R"), DeploymentConfig(), RankedConfig, ((), {}), pickle.dumps, rank
    )
    await ranked.start()
    await ranked.update_config(DeploymentConfig(user_config={"k": 1}))
    assert isinstance(ranked.instance, RankedConfig)
    assert ranked.instance.calls == [(None, rank), ({"k": 1}, rank)]
    plain = ReplicaCore(
        "r2", DeploymentID("a", "P"), DeploymentConfig(), PlainConfig, ((), {}), pickle.dumps, rank
    )
    await plain.start()
    await plain.update_config(DeploymentConfig(user_config={"k": 2}))
    assert isinstance(plain.instance, PlainConfig) and plain.instance.calls == [{"k": 2}]
