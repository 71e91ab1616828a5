"""Apps for upgrades in a full cluster and placement: a "model" whose replicas each hold
one ``test_accelerator`` (the test cluster has two: a stand-in for GPUs)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI

import app_toolkit as tk
from tests.deployments import as_deployment

#: The test cluster's stand-in for a GPU (tests/conftest.py: two of them).
TEST_RESOURCE = "test_accelerator"
#: One accelerator per replica: two replicas fill the test cluster.
WHOLE = {"resources": {TEST_RESOURCE: 1}}


def make_model_app(
    version: str, options: Mapping[str, Any], *, broken: bool = False, gate: str = ""
) -> tk.Application:
    """An ingress that answers GET /infer with its version and rank. ``broken``: its
    constructor raises (a version that cannot start). ``gate``: a file path; the
    constructor writes its rank to ``<gate>.<replica id>`` and waits (bounded) until the
    gate file exists, so a test can look at an upgrade while its new replicas start."""
    api = FastAPI()

    @tk.deployment(**{"ray_actor_options": WHOLE, "num_replicas": 2, **options})
    @tk.ingress(api)
    class Model:
        def __init__(self) -> None:
            if broken:
                raise RuntimeError(f"model {version} cannot load its weights")
            if gate:
                context = tk.get_replica_context()
                Path(f"{gate}.{context.replica_id}").write_text(json.dumps(_rank_of(context)))
                give_up = time.monotonic() + 60  # never hangs a test for good
                while not Path(gate).exists() and time.monotonic() < give_up:
                    time.sleep(0.05)

        @api.get("/infer")
        async def infer(self, seconds: float = 0.0) -> dict[str, Any]:
            await asyncio.sleep(seconds)
            return {"version": version, **_rank_of(tk.get_replica_context())}

    return as_deployment(Model).bind()


def _rank_of(context: tk.ReplicaContext) -> dict[str, Any]:
    rank = context.rank
    assert rank is not None
    return {
        "replica": context.replica_id,
        "rank": [rank.rank, rank.node_rank, rank.local_rank],
        "world_size": context.world_size,
    }


# --8<-- [start:grouped]
@tk.deployment(
    placement_group_bundles=[{TEST_RESOURCE: 1}, {TEST_RESOURCE: 1}],
    placement_group_strategy="PACK",
    ray_actor_options=WHOLE,
    rolling_update_percentage=0.5,  # an upgrade replaces half of the replicas at a time
    max_surge_percent=25,
)
class Grouped:
    """A replica that reserves both accelerators: one for itself, one for a worker."""

    def where(self) -> str:
        return tk.get_replica_context().replica_id


# --8<-- [end:grouped]

grouped_app = as_deployment(Grouped).bind()


@tk.deployment(num_replicas=2)
class Pair:
    """Two replicas of nothing much (target_capacity scales them)."""

    def ping(self) -> str:
        return "pong"


pair = as_deployment(Pair).bind()
