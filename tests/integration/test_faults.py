"""Fault injection on a real local Ray cluster: a replica process SIGKILLed under load."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from dataclasses import dataclass

import httpx
import ray

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import NAMESPACE
from tests.apps import basic
from tests.conftest import Toolkit
from tests.waiting import wait_for

WORKERS = 8


@dataclass(frozen=True)
class Outcome:
    at: float
    status: int  # 0: no response (timeout or broken connection)
    retry_after: str | None


def test_a_replica_killed_under_load_fails_only_its_running_requests(ray_toolkit: Toolkit) -> None:
    name = ray_toolkit.name()
    app = basic.make_versioned_app("v1", num_replicas=2, health_check_period_s=0.5, health_check_timeout_s=2)
    ray_toolkit.run(app, name=name, route_prefix="/kill")

    def replicas() -> list[tk.ReplicaStatusInfo]:
        return tk.status().applications[name].deployments["Ingress"].replicas

    victim = replicas()[0].replica_id
    actor = ray.get_actor(f"app_toolkit_replica:{victim}", namespace=NAMESPACE)
    pid = ray.get(actor.stats.remote(), timeout=30)["pid"]
    outcomes: list[Outcome] = []
    stop = threading.Event()

    async def load() -> None:
        async with ray_toolkit.async_client(timeout=10) as client:

            async def worker() -> None:
                while not stop.is_set():
                    try:
                        response = await client.get("/kill/version", params={"seconds": 0.05})
                        outcomes.append(
                            Outcome(
                                time.monotonic(), response.status_code, response.headers.get("retry-after")
                            )
                        )
                    except httpx.HTTPError:
                        outcomes.append(Outcome(time.monotonic(), 0, None))

            await asyncio.gather(*(worker() for _ in range(WORKERS)))

    loader = threading.Thread(target=lambda: asyncio.run(load()))
    loader.start()
    try:
        wait_for(lambda: len(outcomes) >= 50, 20, "the load to get going")
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # a process this test's deployment started

        def replaced() -> bool:
            current = replicas()
            ids = {r.replica_id for r in current}
            return victim not in ids and sum(r.state is tk.ReplicaState.RUNNING for r in current) == 2

        wait_for(replaced, 30, f"a replacement of {victim}")
        replaced_at = time.monotonic()
        # A second later every caller has the new table: from then on nothing fails.
        wait_for(
            lambda: sum(o.at > replaced_at + 1 for o in outcomes) >= 100,
            20,
            "load to go on after the replacement",
        )
    finally:
        stop.set()
        loader.join(timeout=30)
    failed = [o for o in outcomes if o.status != 200]
    assert all(o.status == 503 and o.retry_after == "1" for o in failed), failed  # no hangs
    assert len(failed) <= WORKERS  # at most the requests that were running on it
    after = [o for o in outcomes if o.at > replaced_at + 1]
    assert after and all(o.status == 200 for o in after)
    print(
        f"replacement serving {replaced_at - killed_at:.2f} s after SIGKILL; "
        f"{len(failed)} of {len(outcomes)} requests failed (503)"
    )


def test_a_killed_proxy_is_restarted_and_relearns_the_routes(ray_toolkit: Toolkit) -> None:
    name = ray_toolkit.name()
    ray_toolkit.run(basic.make_versioned_app("v1"), name=name, route_prefix="/proxied")
    proxies = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == NAMESPACE and a["name"].startswith("app_toolkit_proxy:")
    ]
    proxy = ray.get_actor(proxies[0], namespace=NAMESPACE)
    pid = ray.get(proxy.stats.remote(), timeout=30)["pid"]
    os.kill(pid, signal.SIGKILL)  # the proxy process this session started
    killed_at = time.monotonic()

    def serving() -> bool:
        try:
            response = httpx.get(ray_toolkit.url + "/proxied/version", timeout=5)
        except httpx.HTTPError:
            return False
        return response.status_code == 200 and response.json()["version"] == "v1"

    wait_for(serving, 60, "the proxy to come back", interval_s=0.1)
    assert ray.get(proxy.stats.remote(), timeout=30)["pid"] != pid
    print(f"proxy serving again {time.monotonic() - killed_at:.2f} s after SIGKILL")
