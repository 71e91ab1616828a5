"""A two-node Ray cluster on this machine loses its second node under load.

Run in its own process by ``test_multinode.py`` (the test session's Ray is a different,
single-node cluster): ``python -m tests.integration.multinode_scenario``. It prints one
JSON line of observations for the test to check. Every wait is bounded.
"""

from __future__ import annotations

import os

# Every node and the driver on 127.0.0.1 (Ray otherwise advertises the machine's address).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import ray
from ray.cluster_utils import Cluster

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import NAMESPACE, PROXY_PREFIX
from tests.apps.ray_only import make_where_app
from tests.waiting import wait_for

LOADERS = 4
RECOVERY_LIMIT_S = 60.0
AFTER_RECOVERY_S = 2.0


@dataclass
class Outcome:
    at: float  # when the request started: monotonic, then seconds since the node was removed
    ended: float  # when its answer (or failure) came, likewise
    status: int  # 0: the connection failed
    retry_after: str | None
    node: str
    error: str


def _load(url: str, stop: threading.Event, outcomes: list[Outcome]) -> None:
    """Requests on fresh connections, so the kernel spreads them over both proxies."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            response = httpx.get(url, timeout=10)
            status, node = (
                response.status_code,
                response.json().get("node", "") if response.status_code == 200 else "",
            )
            retry_after, error = response.headers.get("retry-after"), ""
        except httpx.HTTPError as exc:
            status, node, retry_after, error = 0, "", None, type(exc).__name__
        outcomes.append(Outcome(started, time.monotonic(), status, retry_after, node, error))


def _fresh_status(url: str) -> int:
    """One request on a new connection (the kernel picks which proxy accepts it)."""
    try:
        return httpx.get(url, timeout=10).status_code
    except httpx.HTTPError:
        return 0


def main() -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    worker = cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    ray.init(
        address=cluster.address,
        _node_ip_address="127.0.0.1",
        logging_level=logging.WARNING,
        include_dashboard=False,
    )
    head_id = ray.get_runtime_context().get_node_id()
    worker_id = worker.node_id
    result: dict[str, Any] = {"head": head_id, "worker": worker_id}
    try:
        session = tk.start(http_options={"port": 0, "access_log": False}, proxy_location="HeadOnly")
        result["proxies_head_only"] = session.status().proxies
        tk.shutdown()

        session = tk.start(http_options={"port": 0, "access_log": False})
        tk.run(make_where_app(), name="where", route_prefix="/")
        wait_for(lambda: len(session.status().proxies) == 2, 60, "a proxy on each node")
        status = session.status()
        result["proxies_before"] = status.proxy_urls
        result["proxy_states"] = [state.value for state in status.proxies.values()]
        url = next(iter(status.proxy_urls.values())) + "/where"
        replicas = session.status().applications["where"].deployments
        result["replica_nodes_before"] = sorted(r.node_id for d in replicas.values() for r in d.replicas)

        outcomes: list[Outcome] = []
        stop = threading.Event()
        loaders = [threading.Thread(target=_load, args=(url, stop, outcomes)) for _ in range(LOADERS)]
        for loader in loaders:
            loader.start()
        try:
            load_started = time.monotonic()
            wait_for(lambda: len(outcomes) >= 50 and time.monotonic() - load_started > 2, 60, "steady load")
            removed = time.monotonic()
            cluster.remove_node(worker)  # kills every process of that node

            def recovered() -> bool:
                status = session.status()
                deployments = status.applications["where"].deployments.values()
                return list(status.proxies) == [head_id] and all(
                    d.running_replicas == 2 and all(r.node_id == head_id for r in d.replicas)
                    for d in deployments
                )

            wait_for(recovered, RECOVERY_LIMIT_S, "replicas moved to the surviving node")
            result["recovery_s"] = round(time.monotonic() - removed, 2)
            recovered_at = time.monotonic()
            wait_for(lambda: time.monotonic() - recovered_at > AFTER_RECOVERY_S, 10, "load after recovery")
        finally:
            stop.set()
            for loader in loaders:
                loader.join(timeout=30)
        status = session.status()
        result["proxies_after"] = status.proxies
        joined = cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
        result["joined"] = joined.node_id
        wait_for(lambda: joined.node_id in session.status().proxies, 60, "a proxy on the node that joined")
        result["proxies_joined"] = session.status().proxy_urls
        # Both replicas run on the head now: its proxy hands connections to them; the new
        # node's proxy has no local replica and forwards what it accepts over the channel.
        proxies: dict[str, Any] = {  # Any: ray types actor methods as Never
            node: ray.get_actor(PROXY_PREFIX + node, namespace=NAMESPACE)
            for node in (head_id, joined.node_id)
        }
        before_stats = {node: ray.get(actor.stats.remote()) for node, actor in proxies.items()}
        result["after_join"] = [_fresh_status(url) for _ in range(40)]
        result["proxy_stats"] = {
            node: {
                key: ray.get(actor.stats.remote())[key] - before_stats[node][key]
                for key in ("handed_off", "served")
            }
            for node, actor in proxies.items()
        }
        result["replica_nodes_after"] = sorted(
            r.node_id for d in status.applications["where"].deployments.values() for r in d.replicas
        )
        result["outcomes"] = [
            {**asdict(o), "at": round(o.at - removed, 3), "ended": round(o.ended - removed, 3)}
            for o in outcomes
        ]
        tk.shutdown()
    finally:
        print(json.dumps(result), flush=True)
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]  # ray's test Cluster is unannotated


if __name__ == "__main__":
    main()
