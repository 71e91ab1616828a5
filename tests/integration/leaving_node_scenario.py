"""A worker node leaves a two-node cluster on this machine the way a Kubernetes pod whose
command is ``ray start --block`` does: that process gets SIGTERM, Ray drains the node, and
the toolkit moves its work off before it goes. Also: ``max_replicas_per_node`` over the
two nodes.

Run in its own process by ``test_leaving_node.py`` (the test session's Ray is a different,
single-node cluster): ``python -m tests.integration.leaving_node_scenario``. It prints one
JSON line of observations for the test to check. Every wait is bounded.
"""

from __future__ import annotations

import os

# Every node and the driver on 127.0.0.1 (Ray otherwise advertises the machine's address).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import json
import logging
import signal
import subprocess
import sys
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
#: How long Ray's drain of a node whose ``ray start --block`` got SIGTERM may last (Ray's
#: RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S; its default, 30 s, here too).
RAY_DRAIN_S = 30.0
#: The replicas' graceful_shutdown_timeout_s.
GRACE_S = 2.0


@dataclass
class Outcome:
    at: float  # when the request started (monotonic; then seconds since the SIGTERM)
    ended: float
    status: int  # 0: the request failed without a status
    node: str
    error: str


def _load(url: str, stop: threading.Event, outcomes: list[Outcome]) -> None:
    """Requests on fresh connections, so the kernel spreads them over both proxies."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            response = httpx.get(url, timeout=30)
            node = response.json().get("node", "") if response.status_code == 200 else ""
            status, error = response.status_code, "" if response.status_code == 200 else response.text[:200]
        except httpx.HTTPError as exc:
            status, node, error = 0, "", repr(exc)
        outcomes.append(Outcome(started, time.monotonic(), status, node, error))


def _join_worker(address: str) -> tuple[subprocess.Popen[str], str]:
    """A worker node started as a pod starts one, ``ray start --block`` (its process is
    what gets SIGTERM: ``ray_worker_node.py``); returns the process and the node's id."""
    command = [sys.executable, "-m", "tests.integration.ray_worker_node", address, "2"]
    env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(RAY_DRAIN_S)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()  # "node <id>" once it runs (or "" if it died)
    assert line.startswith("node "), f"the worker node did not start: {line!r}"
    node = line.split()[1]
    wait_for(lambda: _alive(node), 60, "the worker node to join")
    return process, node


def _alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())  # type: ignore[no-untyped-call]


def main() -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    ray.init(
        address=cluster.address,
        _node_ip_address="127.0.0.1",
        logging_level=logging.WARNING,
        include_dashboard=False,
    )
    head = ray.get_runtime_context().get_node_id()
    worker_process, worker = _join_worker(cluster.address)
    result: dict[str, Any] = {"head": head, "worker": worker}
    try:
        session = tk.start(http_options={"port": 0, "access_log": False})
        wait_for(lambda: len(session.status().proxies) == 2, 60, "a proxy on each node")

        result["capped"] = _capped(session)

        tk.run(make_where_app(graceful_shutdown_timeout_s=GRACE_S), name="where", route_prefix="/")
        url = next(iter(session.status().proxy_urls.values())) + "/where"
        deployment = session.status().applications["where"].deployments["Ingress"]
        result["replica_nodes_before"] = sorted(r.node_id for r in deployment.replicas)

        outcomes: list[Outcome] = []
        stop = threading.Event()
        loaders = [threading.Thread(target=_load, args=(url, stop, outcomes)) for _ in range(LOADERS)]
        for loader in loaders:
            loader.start()
        try:
            wait_for(
                lambda: len({o.node for o in outcomes}) >= 2 and len(outcomes) >= 50, 60, "both nodes serving"
            )
            signalled = time.monotonic()
            worker_process.send_signal(signal.SIGTERM)
            proxy: Any = ray.get_actor(PROXY_PREFIX + worker, namespace=NAMESPACE)  # ray types it Never
            leaving = wait_for(
                lambda: ray.get(proxy.stats.remote())["leaving"], 30, "the proxy told its node leaves"
            )
            result["proxy_leaving_s"] = round(time.monotonic() - signalled, 2) if leaving else None
            result["draining_seen"] = worker in session.status().draining_nodes
            wait_for(lambda: not _alive(worker), RAY_DRAIN_S + 30, "the worker node gone")
            result["node_gone_s"] = round(time.monotonic() - signalled, 2)
            worker_process.wait(timeout=30)
            result["process_exit_s"] = round(time.monotonic() - signalled, 2)

            def moved() -> bool:
                deployment = session.status().applications["where"].deployments["Ingress"]
                return deployment.running_replicas == 2 and all(
                    r.node_id == head for r in deployment.replicas
                )

            wait_for(moved, 60, "both replicas on the head node")
            after = time.monotonic()
            wait_for(lambda: time.monotonic() - after > 2, 10, "load after the move")
        finally:
            stop.set()
            for loader in loaders:
                loader.join(timeout=60)
        result["replica_nodes_after"] = sorted(
            r.node_id for r in session.status().applications["where"].deployments["Ingress"].replicas
        )
        result["proxies_after"] = wait_for(
            lambda: (proxies := list(session.status().proxies)) == [head] and proxies, 30, "one proxy"
        )
        result["outcomes"] = [
            {**asdict(o), "at": round(o.at - signalled, 3), "ended": round(o.ended - signalled, 3)}
            for o in outcomes
        ]
        tk.shutdown()
    finally:
        print(json.dumps(result), flush=True)
        if worker_process.poll() is None:
            worker_process.kill()
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]  # ray's test Cluster is unannotated


def _capped(session: Any) -> dict[str, Any]:
    """Three replicas of at most one per node on two nodes: what status says."""
    from app_toolkit.build import build_app

    app = make_where_app(num_replicas=3, max_replicas_per_node=1)
    session.deploy(build_app(app, "capped", None, session.serialize))

    def settled() -> Any:
        deployment = session.status().applications["capped"].deployments["Ingress"]
        states = sorted(r.state.value for r in deployment.replicas)
        return (
            deployment
            if states == ["RUNNING", "RUNNING", "STARTING"] and "max_replicas_per_node" in deployment.message
            else None
        )

    deployment = wait_for(settled, 90, "two replicas running and a third waiting, saying why")
    found = {
        "nodes": sorted(r.node_id for r in deployment.replicas if r.state is tk.ReplicaState.RUNNING),
        "message": deployment.message,
    }
    tk.delete("capped")
    return found


if __name__ == "__main__":
    main()
