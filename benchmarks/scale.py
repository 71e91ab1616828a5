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
import contextlib
import gc
import itertools
import logging
import multiprocessing
import pickle
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from app_toolkit._runtime.controller import publishing
from app_toolkit._runtime.controller.controller import ControllerCore
from app_toolkit._runtime.controller.heap import HeapKeeper
from app_toolkit._runtime.messages import AdoptedReplica, AppSpec, DeploymentID, DeploymentSpec, ReplicaInfo
from app_toolkit._runtime.tables import Loads, Outcomes, ReplicaTable, Table, replicas_key
from app_toolkit.config import AutoscalingConfig, DeploymentConfig
from app_toolkit.exceptions import ReplicaUnavailableError
from benchmarks import scale_callers, scale_plot, scale_wire
from benchmarks.percentile import percentile


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


def _app(index: int, replicas: int, health_period_s: float) -> AppSpec:
    """One application of one autoscaled deployment. The callers' loads are small, so
    the autoscaler keeps it at ``replicas`` (its minimum)."""
    name = f"app{index}"
    autoscaling = AutoscalingConfig(
        min_replicas=replicas, max_replicas=2 * replicas, target_ongoing_requests=100
    )
    config = DeploymentConfig(autoscaling_config=autoscaling, health_check_period_s=health_period_s)
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


#: How long a caller process may take to answer the benchmark (its callers' tables).
_ANSWER_TIMEOUT_S = 600.0


async def _until(condition: Any, timeout_s: float, what: str) -> float:
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError(f"{what} took longer than {timeout_s} s")
        await asyncio.sleep(0.005)
    return time.perf_counter() - started


async def measure(
    replicas: int, nodes: int, deployments: int, options: argparse.Namespace
) -> dict[str, float]:
    gc.collect()
    rss_before = _rss_mb()
    backend = SimBackend(nodes, options.start_delay)
    # The controller's process freezes its heap once settled, as on Ray (controller/heap.py).
    core = ControllerCore(backend, heap=None if options.plain_gc else HeapKeeper())
    reconciles: list[float] = []
    reconcile = core._reconcile

    def timed() -> None:
        started = time.perf_counter()
        reconcile()
        reconciles.append(time.perf_counter() - started)

    core._reconcile = timed  # type: ignore[method-assign]
    await core.start()
    per_deployment = replicas // deployments
    apps = [_app(i, per_deployment, options.health_period) for i in range(deployments)]
    ingresses = [DeploymentID(app.name, app.ingress) for app in apps]

    async def record_load(caller: str, loads: Loads, outcomes: Outcomes) -> None:
        await core.record_load(caller, loads, outcomes)

    server, port = await scale_wire.serve({"listen": core.listen, "record_load": record_load})
    with _Callers(port, nodes, ingresses, options) as callers:
        _progress(f"{replicas} replicas: deploying")

        # Deploy everything; time until every replica runs, less the simulated start delay.
        started = time.perf_counter()
        for app in apps:
            await core.deploy_app(app)
        total = per_deployment * deployments
        deploy_s = await _until(lambda: len(backend.running) >= total, 600, "the deploy")
        deploy_s -= options.start_delay
        _progress(f"deployed in {deploy_s:.2f} s; waiting for every caller's tables")
        await callers.ask(("ready", {replicas_key(d): per_deployment for d in ingresses}))
        _progress("every caller holds every table; steady state")

        # Steady state: one health-check period with everything running and callers
        # reporting load; then the same with replicas dying at --churn per second.
        pauses: list[float] = []
        steady_cpu, steady_reconciles = await _steady(options.health_period, reconciles, pauses)
        churn_cpu = await _churn(core, backend, ingresses, options.churn, options.health_period)

        _progress(f"{options.deaths} replicas die, one at a time")
        # Replicas die, one at a time: time until every caller's table has left it out.
        victims = [ingresses[-1 - n % len(ingresses)] for n in range(options.deaths)]
        deaths = [await _one_death(core, backend, callers, deployment) for deployment in victims]
        detect_s = statistics.median(detect for detect, _ in deaths)
        fan_outs = [fan_out for _, fan_out in deaths]
        victim_deployment = ingresses[-1]
        table_bytes = len(pickle.dumps(core.longpoll.get(replicas_key(victim_deployment))))
        rss_after = _rss_mb()
        server.close()
    await core.stop()
    return {
        "replicas": total,
        "nodes": nodes,
        "deployments": deployments,
        "reconcile_p50_ms": statistics.median(steady_reconciles) * 1000,
        "reconcile_p99_ms": percentile(steady_reconciles, 0.99) * 1000,
        "deploy_s": deploy_s,
        "detect_s": detect_s,
        "fan_out_s": statistics.median(fan_outs),
        "fan_out_max_s": max(fan_outs),
        "table_bytes": table_bytes,
        "rss_growth_mb": rss_after - rss_before,
        "steady_cpu": steady_cpu,
        "churn_cpu": churn_cpu,
        "gc_max_ms": max(pauses, default=0.0) * 1000,
        "elapsed_s": time.perf_counter() - started,
    }


async def _one_death(
    core: ControllerCore, backend: SimBackend, callers: _Callers, deployment: DeploymentID
) -> tuple[float, float]:
    """Kill one replica of ``deployment``; how long until the controller published a table
    without it, and from then until every caller held that table."""
    table = core.longpoll.get(replicas_key(deployment))
    assert isinstance(table, ReplicaTable)
    victim = table.replicas[0].replica_id
    backend.dead.add(victim)
    published_at = 0.0

    def published_without() -> bool:
        nonlocal published_at
        current = core.longpoll.get(replicas_key(deployment))
        gone = isinstance(current, ReplicaTable) and all(r.replica_id != victim for r in current.replicas)
        if gone and not published_at:
            published_at = time.monotonic()
        return gone

    # Noticing takes up to a health-check period; what scale changes is the fan-out after
    # it: from the publish to every caller's table.
    seen_by_all = asyncio.ensure_future(callers.ask(("without", replicas_key(deployment), victim)))
    detect_s = await _until(published_without, 120, "the death to be noticed")
    return detect_s, await seen_by_all - published_at


async def _steady(period_s: float, reconciles: list[float], pauses: list[float]) -> tuple[float, list[float]]:
    """The controller's CPU per second, its reconcile passes and its garbage
    collector's pauses, over one period."""
    reconciles.clear()
    started_at = 0.0

    def timing(phase: str, info: dict[str, int]) -> None:
        nonlocal started_at
        if phase == "start":
            started_at = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - started_at)

    gc.callbacks.append(timing)
    cpu_before, wall_before = _cpu_s(), time.perf_counter()
    try:
        await asyncio.sleep(period_s)
    finally:
        gc.callbacks.remove(timing)
    return (_cpu_s() - cpu_before) / (time.perf_counter() - wall_before), list(reconciles)


async def _churn(
    core: ControllerCore, backend: SimBackend, ingresses: list[DeploymentID], per_s: float, period_s: float
) -> float:
    """The controller's CPU per second while ``per_s`` replicas die every second."""
    if per_s <= 0:
        return 0.0
    cpu_before, wall_before = _cpu_s(), time.perf_counter()
    deaths = int(per_s * period_s)
    for index in range(deaths):
        table = core.longpoll.get(replicas_key(ingresses[index % len(ingresses)]))
        if isinstance(table, ReplicaTable) and table.replicas:
            backend.dead.add(table.replicas[-1].replica_id)
        await asyncio.sleep(1 / per_s)
    return (_cpu_s() - cpu_before) / (time.perf_counter() - wall_before)


class _Callers:
    """The simulated callers: ``--caller-processes`` processes sharing the nodes."""

    def __init__(
        self, port: int, nodes: int, ingresses: list[DeploymentID], options: argparse.Namespace
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipes: list[Connection] = []
        self._processes: list[BaseProcess] = []
        count = options.caller_processes
        for index in range(count):
            ours, theirs = context.Pipe()
            share = nodes // count + (1 if index < nodes % count else 0)
            self._pipes.append(ours)
            self._processes.append(
                context.Process(
                    target=scale_callers.run, args=(port, share, ingresses, options.busy, theirs), daemon=True
                )
            )

    async def ask(self, command: tuple[Any, ...]) -> float:
        """Send ``command`` to every caller process; the latest of their answers."""
        loop = asyncio.get_running_loop()
        for pipe in self._pipes:
            pipe.send(command)
        answers = [await loop.run_in_executor(None, _recv, pipe) for pipe in self._pipes]
        return max(answers)

    def __enter__(self) -> _Callers:
        for process in self._processes:
            process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.send(("stop",))
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()


def _recv(pipe: Connection) -> float:
    if not pipe.poll(_ANSWER_TIMEOUT_S):
        raise TimeoutError(f"the callers did not answer within {_ANSWER_TIMEOUT_S} s")
    answer: float = pipe.recv()
    return answer


def _progress(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


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
    parser.add_argument(
        "--health-period", type=float, default=10.0, help="health_check_period_s (default: the default)"
    )
    parser.add_argument("--churn", type=float, default=2.0, help="replicas dying per second, churn phase")
    parser.add_argument(
        "--busy", type=float, default=0.1, help="share of deployments every caller reports load for"
    )
    parser.add_argument("--caller-processes", type=int, default=2, help="processes the callers share")
    parser.add_argument("--deaths", type=int, default=5, help="replicas killed one at a time, fan-out")
    parser.add_argument("--plot", default="", help="write the curves to this PNG (needs matplotlib)")
    parser.add_argument(
        "--plain-gc",
        action="store_true",
        help="no heap freezing in the controller (the collector as it comes)",
    )
    options = parser.parse_args()
    # Deaths are logged as warnings; thousands of them would bury the results.
    logging.getLogger("app_toolkit").setLevel(logging.ERROR)
    publishing.TABLES_STORE_PERIOD_S = 0.5
    results = []
    for size in options.sizes.split(","):
        replicas, nodes, deployments = _size(size)
        result = asyncio.run(measure(replicas, nodes, deployments, options))
        results.append(result)
        replicas_n, nodes_n, apps_n = (int(result[key]) for key in ("replicas", "nodes", "deployments"))
        size = f"{replicas_n} replicas, {nodes_n} nodes, {apps_n} apps"
        print(
            f"{size:36} | reconcile p50 {result['reconcile_p50_ms']:6.2f} ms "
            f"p99 {result['reconcile_p99_ms']:7.2f} ms | deploy {result['deploy_s']:6.2f} s | "
            f"death seen {result['detect_s']:5.2f} s, then all tables {result['fan_out_s']:6.3f} s "
            f"(max {result['fan_out_max_s']:6.3f}) | "
            f"table {result['table_bytes']:5.0f} B | controller RSS +{result['rss_growth_mb']:5.0f} MB | "
            f"CPU steady {result['steady_cpu']:.2f}, churn {result['churn_cpu']:.2f} core | "
            f"GC pause max {result['gc_max_ms']:.0f} ms",
            flush=True,
        )
    if options.plot:
        scale_plot.plot(results, options.plot)
        print(f"Curves written to {options.plot}")


if __name__ == "__main__":
    main()
