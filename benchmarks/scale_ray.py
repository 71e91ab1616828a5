"""The scale simulation checked against a real Ray cluster, at the size this machine holds.

A ``ray.cluster_utils.Cluster`` of ``--nodes`` nodes on this machine (one proxy each),
``--apps`` applications of tiny replicas (no CPU reserved). Measured:

- what one replica costs in memory (the machine's available memory before and after);
- deploy: from handing every application to the controller to all replicas RUNNING;
- reconcile p50/p99: ``app_toolkit_controller_reconcile_seconds`` over a quiet period;
- death to table: a replica is killed; the time until a handle in this process (a real
  caller following the table over Ray) no longer holds it. Detection comes first: up to
  one health-check period.

Then the simulation (``scale.py``) runs at the same size and health-check period, and
both are printed side by side.

    python -m benchmarks.scale_ray [--nodes 4] [--apps 8] [--replicas 64]
"""

from __future__ import annotations

import os

# Every node and the driver on 127.0.0.1 (Ray otherwise advertises the machine's address).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse
import asyncio
import logging
import time
from typing import Any

import httpx
import ray
from ray.cluster_utils import Cluster

import app_toolkit as tk
from app_toolkit import handle as handle_module
from app_toolkit import metrics
from app_toolkit._runtime.backends.ray.cluster import replica_actor
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit.api import parse_application_options
from app_toolkit.build import build_app
from benchmarks import scale


@tk.deployment
class Tiny:
    async def __call__(self, request: Any) -> str:
        return "ok"


def _available_mb() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _until(condition: Any, timeout_s: float, what: str, poll_s: float = 0.01) -> float:
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError(f"{what} took longer than {timeout_s} s")
        time.sleep(poll_s)
    return time.perf_counter() - started


def _reconcile_buckets(urls: list[str]) -> dict[float, float]:
    """The reconcile histogram's cumulative count per upper bound, from the proxies'
    /-/metrics (the one on the controller's node reads the controller's process)."""
    text = "\n".join(httpx.get(f"{url}/-/metrics", timeout=30).text for url in urls)
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("app_toolkit_controller_reconcile_seconds_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            upper = float("inf") if bound == "+Inf" else float(bound)
            buckets[upper] = buckets.get(upper, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def measure_ray(options: argparse.Namespace) -> dict[str, float]:
    nodes, apps, per_app = options.nodes, options.apps, options.replicas // options.apps
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, _node_ip_address="127.0.0.1", logging_level=logging.WARNING)
    try:
        session = tk.start(http_options={"port": 0, "access_log": False})
        _until(lambda: len(session.status().proxies) == nodes, 120, "a proxy on every node")
        available_before = _available_mb()
        started = time.perf_counter()
        for index in range(apps):
            tiny = Tiny.options(
                num_replicas=per_app,
                health_check_period_s=options.health_period,
                ray_actor_options={"num_cpus": 0},
            )
            app_options = parse_application_options(f"app{index}", f"/app{index}")
            session.deploy(
                build_app(tiny.bind(), app_options.name, app_options.route_prefix, session.serialize)
            )

        def all_running() -> bool:
            status = session.status().applications
            return all(
                f"app{i}" in status and status[f"app{i}"].deployments["Tiny"].running_replicas == per_app
                for i in range(apps)
            )

        _until(all_running, 900, "the deploy", poll_s=0.2)
        deploy_s = time.perf_counter() - started
        time.sleep(5)  # replicas settle (imports, first health checks)
        per_replica_mb = (available_before - _available_mb()) / (per_app * apps)

        # The proxy on the controller's node shows its metrics; read every proxy.
        urls = list(session.status().proxy_urls.values())
        before = _reconcile_buckets(urls)
        time.sleep(max(10.0, options.health_period * 2))  # 100+ passes: a p99 worth the name
        after = _reconcile_buckets(urls)
        window = [(bound, count - before.get(bound, 0.0)) for bound, count in sorted(after.items())]
        p50 = metrics.quantile(window, 0.5) or 0.0
        p99 = metrics.quantile(window, 0.99) or 0.0

        # A replica dies; a handle here follows app0's table over Ray like any caller.
        handle = tk.get_app_handle("app0")
        assert handle.remote(None).result(timeout_s=30) == "ok"
        # Its dispatcher exists after that call; only read from here (it lives on the
        # handle's event loop thread).
        dispatcher = handle_module._data_plane().dispatcher(DeploymentID("app0", "Tiny"))
        replicas = session.status().applications["app0"].deployments["Tiny"].replicas
        victim = replicas[0].replica_id
        held = _held(dispatcher)
        _until(lambda: victim in held(), 30, "the handle's first table")
        ray.kill(replica_actor(victim), no_restart=True)
        death_to_table_s = _until(lambda: victim not in held(), 120, "the death to reach the handle")
        return {
            "replicas": per_app * apps,
            "nodes": nodes,
            "deployments": apps,
            "deploy_s": deploy_s,
            "reconcile_p50_ms": p50 * 1000,
            "reconcile_p99_ms": p99 * 1000,
            "death_to_table_s": death_to_table_s,
            "replica_mb": per_replica_mb,
        }
    finally:
        tk.shutdown()
        ray.shutdown()
        cluster.shutdown()


def _held(dispatcher: Any) -> Any:
    """The replica ids a caller's dispatcher holds now."""

    def ids() -> set[str]:
        return set(dispatcher._chooser.replica_ids)

    return ids


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--apps", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--health-period", type=float, default=1.0)
    options = parser.parse_args()
    real = measure_ray(options)
    sim_options = argparse.Namespace(
        start_delay=0.05,
        health_period=options.health_period,
        churn=0.0,
        busy=0.0,
        caller_processes=1,
        deaths=3,
    )
    simulated = asyncio.run(scale.measure(real["replicas"], options.nodes, options.apps, sim_options))
    simulated["death_to_table_s"] = simulated["detect_s"] + simulated["fan_out_s"]
    print(f"{int(real['replicas'])} replicas, {options.nodes} nodes, {options.apps} apps:")
    print(f"  one replica on Ray: {real['replica_mb']:.0f} MB of memory")
    print(
        f"  deploy to RUNNING: Ray {real['deploy_s']:.1f} s (starting {int(real['replicas'])} worker "
        f"processes on this machine's cores), simulated {simulated['deploy_s']:.3f} s (the "
        "controller's part only: no process starts)"
    )
    for key, label in (
        ("reconcile_p50_ms", "reconcile p50 (ms)"),
        ("reconcile_p99_ms", "reconcile p99 (ms)"),
        ("death_to_table_s", "death to a caller's table (s)"),
    ):
        ratio = real[key] / simulated[key] if simulated[key] else float("inf")
        print(f"  {label:32} Ray {real[key]:8.3f}   simulated {simulated[key]:8.3f}   ratio {ratio:6.2f}")


if __name__ == "__main__":
    main()
