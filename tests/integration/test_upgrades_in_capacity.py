"""Upgrades of a model whose replicas fill the cluster: each holds one of the test
cluster's two ``test_accelerator`` resources (a stand-in for GPUs), so a second copy of the
model never fits. The upgrade waits ``surge_timeout_s`` for room, then replaces replicas
in steps; with Ray Serve's ``max_surge_percent=0`` it does so from the start. Load at half
the model's capacity runs through it; no request may fail. Also: a version that cannot
start, ranks during an upgrade, placement groups, target_capacity (Ray, the test
session's single-node cluster)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from ray.util.placement_group import placement_group_table

import app_toolkit as tk
from app_toolkit._runtime.backends.base import current_session
from app_toolkit._runtime.backends.ray.placement import GROUP_PREFIX
from app_toolkit.cli.deploy import apply
from app_toolkit.config.file import parse_config
from tests import plain_http
from tests.apps import placement
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for

#: Upgrade options of every test here: a short wait for room, a short drain.
QUICK = {"surge_timeout_s": 2.0, "graceful_shutdown_timeout_s": 2.0, "max_ongoing_requests": 2}


@contextmanager
def load(url: str, clients: int) -> Iterator[list[tuple[int, str]]]:
    """``clients`` threads sending GET /infer back to back (half the model's capacity
    with two: two replicas of max_ongoing_requests=2 hold four); yields (status, version
    or error) of every request, collected until the block ends."""
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    def send() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                try:
                    response = client.get(url, params={"seconds": 0.05})
                    version = (
                        response.json().get("version", "") if response.status_code == 200 else response.text
                    )
                    seen.append((response.status_code, version))
                except httpx.HTTPError as exc:
                    seen.append((0, repr(exc)))

    threads = [threading.Thread(target=send) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(seen) >= 10, 30, "load to run")
        yield seen
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)


@contextmanager
def watching(name: str) -> Iterator[list[tk.UpgradeStatusInfo | int]]:
    """Status of deployment Model while the block runs: each upgrade seen, and each count
    of its replicas serving (RUNNING), every 50 ms."""
    seen: list[tk.UpgradeStatusInfo | int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            deployment = tk.status().applications[name].deployments["Model"]
            seen.append(deployment.running_replicas)
            if deployment.upgrade is not None:
                seen.append(deployment.upgrade)
            stop.wait(0.05)

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=30)


def upgrades(seen: list[Any]) -> list[tk.UpgradeStatusInfo]:
    return [item for item in seen if isinstance(item, tk.UpgradeStatusInfo)]


def upgrade_under_load(toolkit: Toolkit, name: str, version: str, options: dict[str, Any]) -> list[Any]:
    """Upgrade application ``name`` to ``version`` while two clients keep half its
    capacity busy; asserts no request failed and the new version serves at both
    replicas; returns what status said meanwhile (``watching``)."""
    with load(f"{toolkit.url}/model/infer", clients=2) as seen, watching(name) as status:
        toolkit.run(placement.make_model_app(version, options), name=name, route_prefix="/model")
        mark = len(seen)
        wait_for(lambda: len(seen) > mark + 10, 30, f"load on {version}")
    failures = [item for item in seen if item[0] != 200]
    assert not failures, f"{version}: {len(failures)} of {len(seen)} failed, e.g. {failures[:3]}"
    assert seen[-1][1] == version and len({v for _, v in seen}) == 2, {v for _, v in seen}
    assert min(item for item in status if isinstance(item, int)) >= 1, f"{version}: none served"
    deployment = tk.status().applications[name].deployments["Model"]
    assert deployment.running_replicas == 2 and deployment.upgrade is None
    return status


def test_upgrades_that_have_no_room_for_a_second_copy_finish_under_load_or_roll_back(
    ray_toolkit: Toolkit,
) -> None:
    """About 25 s: three upgrades of one model that fills the cluster. v1 → v2 with the
    default (a 2 s wait for room, then two steps of a drain and a replica start), v2 → v3
    with Ray Serve's max_surge_percent=0 (two steps at once), v3 → a v4 that cannot start
    (a step, three failed starts, v3 back at its full count)."""
    name = ray_toolkit.name()
    ray_toolkit.run(placement.make_model_app("v1", QUICK), name=name, route_prefix="/model")

    steps = upgrades(upgrade_under_load(ray_toolkit, name, "v2", QUICK))
    # The default waited for room, then went in steps of 20 % (one replica of two).
    assert any(u.mode == "surge" and "none free" in u.waiting_for for u in steps), steps
    assert any(u.mode == "steps" and u.step_size == 1 and u.steps == 2 for u in steps), steps
    assert any(u.step == 2 for u in steps), steps

    rolling = {**QUICK, "max_surge_percent": 0}
    steps = upgrades(upgrade_under_load(ray_toolkit, name, "v3", rolling))
    # Ray Serve's rolling update from the start, a replica at a time.
    assert steps and all(u.mode == "rolling" and u.step_size == 1 for u in steps), steps
    assert any(u.step == 2 for u in steps), steps

    with pytest.raises(tk.DeployError, match="cannot load its weights"):
        ray_toolkit.run(placement.make_model_app("v4", QUICK, broken=True), name=name, route_prefix="/model")

    def back() -> bool:
        deployment = tk.status().applications[name].deployments["Model"]
        return deployment.running_replicas == 2 and all(
            r.state is tk.ReplicaState.RUNNING for r in deployment.replicas
        )

    wait_for(back, 60, "v3 back at two replicas")
    deployment = tk.status().applications[name].deployments["Model"]
    assert deployment.status is tk.DeploymentStatus.DEPLOY_FAILED
    assert "brought back to the full count" in deployment.message
    answers = {
        plain_http.get(f"{ray_toolkit.url}/model/infer", timeout=30).json()["version"] for _ in range(6)
    }
    assert answers == {"v3"}


def test_with_room_the_upgrade_surges_never_below_two_replicas_and_ranks_follow(
    ray_toolkit: Toolkit, tmp_path: Path
) -> None:
    """About 6 s: two deploys of replicas that take half an accelerator each (room for
    both versions); the second waits on a gate while the test reads the ranks."""
    name = ray_toolkit.name()
    roomy = {"ray_actor_options": {"resources": {placement.TEST_RESOURCE: 0.5}}, **QUICK}
    ray_toolkit.run(placement.make_model_app("v1", roomy), name=name, route_prefix="/ranks")

    def ranks() -> dict[str, list[int]]:
        # A connection each: direct ingress hands a connection to one replica.
        answers = [plain_http.get(f"{ray_toolkit.url}/ranks/infer", timeout=30).json() for _ in range(12)]
        assert all(answer["world_size"] == 2 for answer in answers)
        return {answer["replica"]: answer["rank"] for answer in answers}

    def well_ranked(found: dict[str, list[int]]) -> bool:
        """Ranks 0 and 1 on one node (node rank 0), local ranks 0 and 1 (as placed)."""
        columns = [sorted(column) for column in zip(*found.values(), strict=True)]
        return columns == [[0, 1], [0, 0], [0, 1]]

    steady = wait_for(lambda: (found := ranks()) and len(found) == 2 and found, 30, "both replicas answer")
    assert well_ranked(steady), steady
    gate = tmp_path / "gate"
    upgrade = threading.Thread(
        target=ray_toolkit.run,
        args=(placement.make_model_app("v2", roomy, gate=str(gate)),),
        kwargs={"name": name, "route_prefix": "/ranks"},
    )
    with watching(name) as status:
        upgrade.start()
        try:
            # The new replicas are constructed (their ranks written) while the old still serve.
            starting = wait_for(
                lambda: len(list(tmp_path.glob("gate.*"))) == 2 and list(tmp_path.glob("gate.*"))
            )
            new_ranks = {path.name: json.loads(path.read_text())["rank"] for path in starting}
            assert well_ranked(new_ranks), new_ranks  # the ranks of the replicas they replace
            # The old ones keep theirs meanwhile (asked until both have answered).
            seen: dict[str, list[int]] = {}
            wait_for(lambda: seen.update(ranks()) or seen.keys() == steady.keys(), 30, "both old replicas")
            assert seen == steady
        finally:
            gate.touch()
            upgrade.join(timeout=60)
    after = wait_for(lambda: (found := ranks()) and len(found) == 2 and found, 30, "both new replicas")
    assert not after.keys() & steady.keys() and well_ranked(after), after
    counts = [item for item in status if isinstance(item, int)]
    assert counts and min(counts) >= 2, counts  # an old replica stopped only once a new one ran
    assert upgrades(status) and all(u.mode == "surge" for u in upgrades(status))


def test_a_placement_group_replica_reserves_its_bundles_and_releases_them(ray_toolkit: Toolkit) -> None:
    """About 4 s: one deploy and its delete."""
    name = ray_toolkit.name()
    handle = ray_toolkit.run(as_deployment(placement.Grouped).bind(), name=name, route_prefix=None)
    replica_id = handle.where.remote().result(timeout_s=30)
    group_name = GROUP_PREFIX + replica_id

    def group() -> dict[str, Any] | None:
        return next((g for g in placement_group_table().values() if g["name"] == group_name), None)

    created = wait_for(lambda: (found := group()) and found["state"] == "CREATED" and found)
    assert created["bundles"] == {0: {placement.TEST_RESOURCE: 1.0}, 1: {placement.TEST_RESOURCE: 1.0}}
    assert free_accelerators() == 0  # both reserved
    tk.delete(name)
    wait_for(lambda: (found := group()) is None or found["state"] == "REMOVED", 30, "the group removed")
    wait_for(lambda: free_accelerators() == 2, 30, "resources back")


def free_accelerators() -> float:
    available: dict[str, float] = ray.available_resources()  # type: ignore[no-untyped-call]  # ray's
    return available.get(placement.TEST_RESOURCE, 0.0)


def test_target_capacity_halves_the_replicas_and_full_capacity_restores_them(ray_toolkit: Toolkit) -> None:
    """About 5 s: a config file applied three times."""
    session = current_session(create=False)
    assert session is not None
    name = ray_toolkit.name()
    ray_toolkit._apps.append(name)  # deleted after the test

    def apply_at(capacity: float | None) -> None:
        data: dict[str, Any] = {
            "applications": [
                {
                    "name": name,
                    "route_prefix": None,
                    "import_path": "tests.apps.placement:pair",
                }
            ]
        }
        if capacity is not None:
            data["target_capacity"] = capacity
        apply(session, parse_config(data, "test"), "test", wait_s=60)

    def running() -> int:
        return tk.status().applications[name].deployments["Pair"].running_replicas

    apply_at(100)
    assert running() == 2
    apply_at(50)
    wait_for(lambda: running() == 1, 30, "half of the replicas")
    assert tk.status().target_capacity == 50
    apply_at(None)
    wait_for(lambda: running() == 2, 30, "all of them again")
    assert tk.status().target_capacity is None
