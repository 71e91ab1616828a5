"""Autoscaling under a step load: idle -> heavy -> idle, on an embedded local Ray.

The deployment (``benchmarks/scaling_app.py``) has ``min_replicas=0``, ``max_replicas=4``
and ``target_ongoing_requests=4``. Reports: cold start (first request sent at zero
replicas until its response), time from the start of the heavy phase until 4 replicas
run, time from the end of the load until zero replicas, and failed requests (must be 0).

Each is broken into phases from the controller's own event times (its autoscaling
decisions, ``tk.status().events``), the replica's status seen RUNNING (polled every
10 ms) and its worker process's start time (/proc): for the cold start, request sent ->
decision -> replica RUNNING -> answered, whether the replica got a fresh worker process or a
spare one (``APP_TOOLKIT_SPARE_REPLICAS``; 0 for the comparison), and what the replica's
own start took in its process (its ``start_phases``); for the step, each decision's time after the load
began, and from the decision to the largest size until every replica runs.
``--import-s 2`` makes the app's module take 2 s to import in its replicas (standing in for
a large library): a spare loads the code ahead, a fresh process pays it at start.

    python -m benchmarks.autoscaling [--clients 16] [--heavy 20] [--import-s 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import app_toolkit as tk
from benchmarks.http_overhead import free_port
from benchmarks.proc_cpu import started_at
from benchmarks.scaling_app import IMPORT_S_ENV, SCALING, app


def running_replicas() -> int:
    return tk.status().applications["scalebench"].deployments["Ingress"].running_replicas


_DECISION = re.compile(r"Ingress: (\d+) -> (\d+) replicas")


def decisions(since: float) -> list[tuple[float, int, int]]:
    """(Unix time, from, to) of the controller's autoscaling decisions since ``since``."""
    found = []
    for event in tk.status().events:
        matched = _DECISION.search(event.message)
        if matched is not None and event.time >= since:
            found.append((event.time, int(matched.group(1)), int(matched.group(2))))
    return found


def replica_actors() -> list[Any]:
    from app_toolkit._runtime.backends.ray.cluster import replica_actor

    replicas = tk.status().applications["scalebench"].deployments["Ingress"].replicas
    return [replica_actor(r.replica_id) for r in replicas]


def replica_pids() -> list[int]:
    import ray

    return [int(ray.get(actor.stats.remote(), timeout=30)["pid"]) for actor in replica_actors()]


def spares_ready(timeout_s: float = 60) -> int:
    """Spare replica processes ready (waits for the first, bounded, unless turned off)."""
    from app_toolkit._runtime.backends.ray.spares import spare_setting

    if not spare_setting().per_node:
        return 0
    deadline = time.monotonic() + timeout_s
    while True:
        ready = sum(tk.status().spare_replicas.values())
        if ready or time.monotonic() > deadline:
            return ready
        time.sleep(0.05)


def spare_loaded_code(timeout_s: float = 60) -> bool:
    """Whether a waiting spare has loaded the deployment's code ahead (waits, bounded)."""
    import ray

    from app_toolkit._runtime.backends.ray.cluster import NAMESPACE, SPARE_PREFIX, named_actors

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name in named_actors():
            if name.startswith(SPARE_PREFIX):
                try:
                    stats = ray.get(ray.get_actor(name, namespace=NAMESPACE).stats.remote(), timeout=10)
                except Exception:  # noqa: BLE001 - a spare going away: look again
                    continue
                if stats.get("preloaded"):
                    return True
        time.sleep(0.1)
    return False


class RunningWatch:
    """The Unix time ``running_replicas()`` first reached ``count`` (polled every 10 ms)."""

    def __init__(self, count: int, timeout_s: float) -> None:
        self.at: float | None = None
        self._count, self._timeout_s = count, timeout_s
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        while time.monotonic() < deadline:
            if running_replicas() >= self._count:
                self.at = time.time()
                return
            time.sleep(0.01)

    def join(self) -> float | None:
        self._thread.join()
        return self.at


def cold_start(base: str) -> float:
    """The first request at zero replicas, timed and broken into phases (printed)."""
    watch = RunningWatch(1, 120)
    sent = time.time()
    httpx.get(base + "/work", params={"seconds": 0}, timeout=120).raise_for_status()
    answered = time.time()
    running = watch.join()
    decided = next((at for at, before, _ in decisions(sent - 1) if before == 0), None)
    started = started_at(replica_pids()[0])
    total = answered - sent
    print(f"cold start (0 -> first response): {total:.2f} s")
    if decided is not None and running is not None:
        worker = (
            f"a fresh worker process, started {started - decided:+.2f} s after the decision"
            if started >= decided - 0.05
            else f"a spare process started {decided - started:.1f} s before"
        )
        print(
            f"  request sent -> scale-up decision {decided - sent:.3f} s | decision -> replica RUNNING "
            f"{running - decided:.3f} s ({worker}) | RUNNING seen -> answered "
            f"{max(answered - running, 0.0):.3f} s (status polled every 10 ms)"
        )
        import ray

        phases = ray.get(replica_actors()[0].start_phases.remote(), timeout=30)
        print(
            f"  in the replica's process: {sum(phases.values()):.3f} s = "
            + " + ".join(f"{step} {seconds:.3f}" for step, seconds in phases.items())
        )
    return total


def wait_until(condition: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until ``condition()`` holds, or None after ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(0.05)
    return None


async def heavy(base: str, clients: int, duration_s: float) -> tuple[int, int]:
    ok = failed = 0
    deadline = time.monotonic() + duration_s

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal ok, failed
        while time.monotonic() < deadline:
            try:
                response = await client.get("/work", params={"seconds": 0.1})
                ok, failed = (ok + 1, failed) if response.status_code == 200 else (ok, failed + 1)
            except httpx.HTTPError:
                failed += 1

    async with httpx.AsyncClient(
        base_url=base, timeout=60, limits=httpx.Limits(max_connections=clients)
    ) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    return ok, failed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--heavy", type=float, default=20)
    parser.add_argument(
        "--import-s",
        type=float,
        default=0.0,
        help="make the app's module take this long to import in its replicas (a large library)",
    )
    args = parser.parse_args()
    if args.import_s:
        os.environ[IMPORT_S_ENV] = str(args.import_s)  # the embedded cluster's workers inherit it
    port = free_port()
    tk.start(backend="ray", http_options={"port": port, "access_log": False})
    base = f"http://127.0.0.1:{port}"
    try:
        tk.run(app, name="scalebench")
        assert running_replicas() == 0, "the deployment should start with zero replicas"
        ready = spares_ready()
        print(f"spare replica processes ready: {ready} (one per node while an app autoscales)")
        if ready:
            print(f"  the app's code loaded in a spare ahead: {'yes' if spare_loaded_code() else 'no'}")
        cold_start(base)

        largest = int(SCALING["max_replicas"])
        watch = RunningWatch(largest, args.heavy)
        load_began = time.time()
        ok, failed = asyncio.run(heavy(base, args.clients, args.heavy))
        reached = watch.join()
        to_zero = wait_until(lambda: running_replicas() == 0, 120)
        steps = [(at, before, after) for at, before, after in decisions(load_began) if after > before]
        print(
            f"heavy load, {args.clients} clients: {largest} replicas after "
            + (f"{reached - load_began:.2f} s" if reached is not None else "never (within the phase)")
        )
        if steps:
            print(
                "  decisions: "
                + ", ".join(f"{before} -> {after} at {at - load_began:.2f} s" for at, before, after in steps)
            )
            last = next((at for at, _, after in steps if after >= largest), None)
            if last is not None and reached is not None:
                print(f"  decision to {largest} -> all {largest} RUNNING: {reached - last:.2f} s")
        print(
            f"idle: zero replicas {to_zero:.2f} s after the load stopped "
            f"(downscale_to_zero_delay_s={SCALING['downscale_to_zero_delay_s']})"
            if to_zero is not None
            else "idle: still not at zero replicas after 120 s"
        )
        print(f"requests: {ok + 1} ok, {failed} failed", flush=True)
    finally:
        tk.shutdown()


if __name__ == "__main__":
    main()
