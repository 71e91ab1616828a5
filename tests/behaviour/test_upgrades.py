"""Upgrades: light options in place, code changes as a rolling replacement under load."""

from __future__ import annotations

import asyncio
import threading

import app_toolkit as tk
from tests.apps import basic
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for


def replica_ids(app: str, deployment: str) -> set[str]:
    return {r.replica_id for r in tk.status().applications[app].deployments[deployment].replicas}


def _replaced(name: str, old: set[str]) -> set[str]:
    """The replicas of ``Configured`` once none of ``old`` is left."""

    def new_ones() -> set[str] | None:
        now = replica_ids(name, "Configured")
        return now if now.isdisjoint(old) else None

    return wait_for(new_ones, 30, "the old replicas to go")


def test_each_run_from_python_is_a_new_version_as_in_ray_serve(toolkit: Toolkit) -> None:
    """run() again replaces every replica, as Ray Serve's serve.run does, even when only a
    light option changed or nothing did (a config file's deploy changes light options in
    place: tests/integration/test_config_deploy.py)."""
    name = toolkit.name()
    configured = as_deployment(basic.Configured)
    handle = toolkit.run(configured.bind(), name=name, route_prefix=None)
    assert handle.greet.remote("ann").result(timeout_s=10) == "hi ann"
    first = replica_ids(name, "Configured")
    changed = configured.options(user_config={"greeting": "hello"}, max_ongoing_requests=7)
    handle = toolkit.run(changed.bind(), name=name, route_prefix=None)
    second = _replaced(name, first)
    assert len(second) == 1
    assert {handle.greet.remote(str(i)).result(timeout_s=10) for i in range(8)} == {
        f"hello {i}" for i in range(8)
    }
    toolkit.run(changed.bind(), name=name, route_prefix=None)  # unchanged
    third = _replaced(name, second)
    assert len(third) == 1


def test_code_change_rolls_out_under_load_with_zero_failures(toolkit: Toolkit) -> None:
    name = toolkit.name()
    toolkit.run(basic.make_versioned_app("v1", num_replicas=2), name=name, route_prefix="/roll")
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    async def load() -> None:
        async with toolkit.async_client() as client:

            async def worker() -> None:
                while not stop.is_set():
                    # Held 20 ms: requests in flight across the swap, without spinning a core.
                    response = await client.get("/roll/version", params={"seconds": 0.02})
                    seen.append(
                        (
                            response.status_code,
                            response.json().get("version", "?")
                            if response.status_code == 200
                            else response.text,
                        )
                    )

            await asyncio.gather(*(worker() for _ in range(4)))

    running = threading.Event()

    async def in_flight() -> str:
        async with toolkit.async_client() as client:
            async with client.stream("GET", "/roll/version/slow", params={"seconds": 2}) as response:
                assert response.status_code == 200
                lines = response.aiter_lines()
                assert await anext(lines) == "started"
                running.set()  # it runs on an old replica: the upgrade may start
                return "".join([line async for line in lines])

    loader = threading.Thread(target=lambda: asyncio.run(load()))
    loader.start()
    slow: list[str] = []
    slow_thread = threading.Thread(target=lambda: slow.append(asyncio.run(in_flight())))
    try:
        wait_for(lambda: len(seen) > 20, 20, "load to run")
        slow_thread.start()
        wait_for(running.is_set, 20, "the long request to run")
        toolkit.run(basic.make_versioned_app("v2", num_replicas=2), name=name, route_prefix="/roll")
        wait_for(lambda: len(seen) > 20 and seen[-1][1] == "v2", 30, "v2 to serve")
        mark = len(seen)
        wait_for(lambda: len(seen) > mark + 20, 20, "more load on v2")
    finally:
        stop.set()
        loader.join(timeout=30)
        slow_thread.join(timeout=30)
    failures = [item for item in seen if item[0] != 200]
    assert not failures, f"{len(failures)} of {len(seen)} failed, e.g. {failures[:3]}"
    versions = [version for _, version in seen]
    assert "v1" in versions and versions[-1] == "v2"
    assert slow == ["v1"]  # the in-flight request finished on the old version
    deployment = tk.status().applications[name].deployments["Ingress"]
    assert len(deployment.replicas) == 2


def test_a_replica_whose_check_health_fails_is_replaced(toolkit: Toolkit) -> None:
    name = toolkit.name()
    handle = toolkit.run(as_deployment(basic.Guarded).bind(), name=name, route_prefix=None)
    sick = handle.fall_ill.remote().result(timeout_s=10)

    def replaced() -> bool:
        replicas = tk.status().applications[name].deployments["Guarded"].replicas
        return sick not in {r.replica_id for r in replicas} and [r.state for r in replicas] == [
            tk.ReplicaState.RUNNING
        ]

    wait_for(replaced, 30, "a healthy replacement")
    assert handle.fall_ill.remote().result(timeout_s=10) != sick
