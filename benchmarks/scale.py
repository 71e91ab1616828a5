"""How far one controller goes: the real controller core, deployment state, autoscaler
and long-poll publishing, driven with simulated replicas and simulated callers.

The backend is simulated: replicas start after ``--start-delay`` seconds, fail health
checks when told, and spread over ``--nodes`` nodes. The callers are real
``TableSubscriber`` objects, one per node (each node's proxy). Each one follows every
application's ingress table over the controller's own ``listen``, in this process,
without Ray. Measured per size:

- reconcile loop: p50/p99 of one ``_reconcile`` pass;
- deploy: from ``deploy_app`` to every replica RUNNING, start delay excluded;
- death to tables: one replica stops answering health checks; the time until every
  subscriber holds a table without it;
- bytes published per table change: the pickled size of one deployment's replica table;
- memory: this process's RSS growth (controller and subscribers together);
- CPU: this process's CPU per second of steady state (idle load reports included).

    python -m benchmarks.scale [--sizes 100x10x1,1000x100x100] [--start-delay 0.05]

A size is REPLICASxNODESxDEPLOYMENTS. Replicas are shared evenly between deployments,
one deployment per application; the largest sizes take minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import pickle
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.channel.frames import Kind
from app_toolkit._runtime.controller import controller as controller_module
from app_toolkit._runtime.controller.controller import ControllerCore
from app_toolkit._runtime.messages import AdoptedReplica, AppSpec, DeploymentID, DeploymentSpec, ReplicaInfo
from app_toolkit._runtime.routing.subscriber import TableSubscriber
from app_toolkit._runtime.tables import ReplicaTable, Table, replicas_key
from app_toolkit.config import DeploymentConfig
from app_toolkit.exceptions import ReplicaUnavailableError


@dataclass
class SimBackend:
    """Replicas as the controller sees them, without processes."""

    nodes: int
    start_delay_s: float
    running: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    _next_node: itertools.count[int] = field(default_factory=itertools.count)

    async def start_replica(
        self, replica_id: str, spec: DeploymentSpec, rank: int
    ) -> tuple[ReplicaInfo, str]:
        await asyncio.sleep(self.start_delay_s)
        node = next(self._next_node) % self.nodes
        self.running.add(replica_id)
        info = ReplicaInfo(
            replica_id, spec.id, f"10.0.{node // 250}.{node % 250}", 9000, b"t",
            spec.config.max_ongoing_requests, f"node-{node}", rank=rank,
        )  # fmt: skip
        return info, replica_id

    async def stop_replica(self, handle: str, graceful: bool) -> None:
        self.running.discard(handle)

    async def check_health(self, handle: str, timeout_s: float) -> None:
        if handle in self.dead:
            raise ReplicaUnavailableError(f"{handle} died")

    async def reconfigure_replica(self, handle: str, config: DeploymentConfig) -> None:
        pass

    async def find_replicas(self) -> list[AdoptedReplica]:
        return []

    async def save_checkpoint(self, data: bytes) -> None:
        pass

    async def load_checkpoint(self) -> bytes | None:
        return None

    async def save_tables(self, tables: dict[str, Table]) -> None:
        pass


class _NoReplica:
    """The simulated callers never send requests; a connection is never opened."""

    async def open(self, kind: Kind, message: Any) -> Exchange:
        raise ReplicaUnavailableError("simulated")

    def close(self) -> None:
        pass


def _app(index: int, replicas: int) -> AppSpec:
    name = f"app{index}"
    config = DeploymentConfig(num_replicas=replicas, health_check_period_s=1.0, health_check_timeout_s=1.0)
    spec = DeploymentSpec(DeploymentID(name, "Ingress"), b"def", b"args", config, True, "v1")
    return AppSpec(name, f"/{name}", "Ingress", (spec,))


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _until(condition: Any, timeout_s: float, what: str) -> float:
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError(f"{what} took longer than {timeout_s} s")
        await asyncio.sleep(0.005)
    return time.perf_counter() - started


async def measure(replicas: int, nodes: int, deployments: int, start_delay_s: float) -> dict[str, float]:
    gc.collect()
    rss_before = _rss_mb()
    backend = SimBackend(nodes, start_delay_s)
    core = ControllerCore(backend)
    reconciles: list[float] = []
    reconcile = core._reconcile

    def timed() -> None:
        started = time.perf_counter()
        reconcile()
        reconciles.append(time.perf_counter() - started)

    core._reconcile = timed  # type: ignore[method-assign]
    await core.start()
    apps = [_app(i, replicas // deployments) for i in range(deployments)]
    subscribers = [
        TableSubscriber(core.listen, lambda info: _NoReplica(), core.record_load) for _ in range(nodes)
    ]
    ingresses = [DeploymentID(app.name, app.ingress) for app in apps]
    for subscriber in subscribers:
        for ingress in ingresses:
            subscriber.dispatcher(ingress)

    # Deploy everything; time until every replica runs, less the simulated start delay.
    started = time.perf_counter()
    for app in apps:
        await core.deploy_app(app)
    total = (replicas // deployments) * deployments
    deploy_s = await _until(lambda: len(backend.running) >= total, 600, "the deploy") - start_delay_s

    def tables_hold(deployment: DeploymentID, count: int, without: str = "") -> bool:
        return all(
            len(s.dispatcher(deployment)._chooser.replica_ids) == count
            and without not in s.dispatcher(deployment)._chooser.replica_ids
            for s in subscribers
        )

    per_deployment = replicas // deployments
    await _until(lambda: all(tables_hold(d, per_deployment) for d in ingresses), 600, "the first tables")

    # Steady state: CPU per second with everything running and nothing changing.
    reconciles.clear()
    cpu_before, wall_before = _cpu_s(), time.perf_counter()
    await asyncio.sleep(5.0)
    steady_cpu = (_cpu_s() - cpu_before) / (time.perf_counter() - wall_before)
    steady_reconciles = list(reconciles)

    # A replica dies: time until every subscriber's table has left it out.
    victim_deployment = ingresses[0]
    table = core.longpoll.get(replicas_key(victim_deployment))
    assert isinstance(table, ReplicaTable)
    victim = table.replicas[0].replica_id
    backend.dead.add(victim)

    def published_without() -> bool:
        current = core.longpoll.get(replicas_key(victim_deployment))
        return isinstance(current, ReplicaTable) and victim not in {r.replica_id for r in current.replicas}

    # Noticing takes up to a health-check period (1 s here); what scale changes is the
    # fan-out after it: from the publish to every subscriber's table.
    detect_s = await _until(published_without, 120, "the death to be noticed")
    fan_out_s = await _until(
        lambda: all(victim not in s.dispatcher(victim_deployment)._chooser.replica_ids for s in subscribers),
        120,
        "the new table to reach every subscriber",
    )
    table_bytes = len(pickle.dumps(core.longpoll.get(replicas_key(victim_deployment))))
    rss_after = _rss_mb()

    for subscriber in subscribers:
        subscriber.close()
    await core.stop()
    return {
        "replicas": total,
        "nodes": nodes,
        "deployments": deployments,
        "reconcile_p50_ms": statistics.median(steady_reconciles) * 1000,
        "reconcile_p99_ms": _p99(steady_reconciles) * 1000,
        "deploy_s": deploy_s,
        "detect_s": detect_s,
        "fan_out_s": fan_out_s,
        "table_bytes": table_bytes,
        "rss_growth_mb": rss_after - rss_before,
        "steady_cpu": steady_cpu,
        "elapsed_s": time.perf_counter() - started,
    }


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def _size(text: str) -> tuple[int, int, int]:
    replicas, nodes, deployments = (int(part) for part in text.split("x"))
    return replicas, nodes, deployments


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100x10x1,1000x100x100", help="REPLICASxNODESxDEPLOYMENTS,...")
    parser.add_argument(
        "--start-delay", type=float, default=0.05, help="seconds a simulated replica takes to start"
    )
    args = parser.parse_args()
    controller_module.TABLES_STORE_PERIOD_S = 0.5
    for size in args.sizes.split(","):
        replicas, nodes, deployments = _size(size)
        result = asyncio.run(measure(replicas, nodes, deployments, args.start_delay))
        replicas_n, nodes_n, apps_n = (int(result[key]) for key in ("replicas", "nodes", "deployments"))
        size = f"{replicas_n} replicas, {nodes_n} nodes, {apps_n} apps"
        print(
            f"{size:36} | reconcile p50 {result['reconcile_p50_ms']:6.2f} ms "
            f"p99 {result['reconcile_p99_ms']:7.2f} ms | deploy {result['deploy_s']:6.2f} s | "
            f"death seen {result['detect_s']:5.2f} s, then all tables {result['fan_out_s']:6.3f} s | "
            f"table {result['table_bytes']:5.0f} B | RSS +{result['rss_growth_mb']:5.0f} MB | "
            f"steady CPU {result['steady_cpu']:.2f} core",
            flush=True,
        )


if __name__ == "__main__":
    main()
