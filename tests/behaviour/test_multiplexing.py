"""Model multiplexing through handles and HTTP, on both backends."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

import app_toolkit as tk
from tests.apps import basic
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for

MODELS = [f"m{i}" for i in range(6)]


def test_requests_go_to_replicas_holding_their_model(toolkit: Toolkit) -> None:
    name = toolkit.name()
    handle = toolkit.run(as_deployment(basic.Models).bind(), name=name, route_prefix=f"/{name}")
    rng = random.Random(7)

    async def burst(count: int, concurrency: int) -> list[dict[str, Any]]:
        slots = asyncio.Semaphore(concurrency)

        async def one(model_id: str) -> dict[str, Any]:
            async with slots:
                answer: dict[str, Any] = await handle.options(multiplexed_model_id=model_id).infer.remote()
                return answer

        return list(await asyncio.gather(*(one(rng.choice(MODELS)) for _ in range(count))))

    warm = asyncio.run(burst(60, 4))
    assert {a["model"] for a in warm} == set(MODELS)

    def replicas_report_all_models() -> bool:
        held = [r.models for r in tk.status().applications[name].deployments["Models"].replicas]
        return sorted(m for models in held for m in models) == MODELS

    wait_for(replicas_report_all_models, 30, "status to show each model on one replica")
    measured = asyncio.run(burst(300, 8))
    loads_before = _loads(warm)
    loads_after = _loads(warm + measured)
    new_loads = sum(loads_after.values()) - sum(loads_before.values())
    assert new_loads <= 0.05 * len(measured), (new_loads, loads_after)
    # A model is never loaded twice on one replica (concurrent requests share one load).
    assert all(count == 1 for count in loads_after.values()), loads_after

    # HTTP: the serve_multiplexed_model_id header names the model, or its hyphen form in
    # any case (what nginx lets through); sent both ways, the last line counts.
    model_of = {a["model"]: a["replica"] for a in measured}
    with toolkit.client() as client:
        for model_id in MODELS:
            for header in ("serve_multiplexed_model_id", "Serve-Multiplexed-Model-Id"):
                answer = client.get(f"/{name}", headers={header: model_id}).json()
                assert answer["model"] == model_id and answer["replica"] == model_of[model_id], header
        both = [("serve-multiplexed-model-id", MODELS[1]), ("serve_multiplexed_model_id", MODELS[0])]
        answer = client.get(f"/{name}", headers=both).json()
        assert answer["model"] == MODELS[0] and answer["replica"] == model_of[MODELS[0]]


def test_a_loader_failure_reaches_the_caller_and_the_next_request_retries(toolkit: Toolkit) -> None:
    handle = toolkit.run(as_deployment(basic.Models).options(num_replicas=1).bind(), route_prefix=None)
    bad = handle.options(multiplexed_model_id="bad-model")
    for _ in range(2):  # not cached: each request calls the loader again
        with pytest.raises(ValueError, match="there is no model bad-model"):
            bad.infer.remote().result(timeout_s=30)
    with pytest.raises(ValueError, match="model id must be a non-empty string"):
        handle.infer.remote().result(timeout_s=30)  # no model named at all


def _loads(answers: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """Loads per (replica, model), from the newest count each replica reported."""
    latest: dict[str, dict[str, int]] = {}
    for answer in answers:
        known = latest.setdefault(answer["replica"], {})
        for model, count in answer["loads"].items():
            known[model] = max(known.get(model, 0), count)
    return {(replica, model): n for replica, loads in latest.items() for model, n in loads.items()}
