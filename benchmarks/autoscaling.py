"""Autoscaling under a step load: idle -> heavy -> idle, on an embedded local Ray.

The deployment (``benchmarks/scaling_app.py``) has ``min_replicas=0``, ``max_replicas=4``
and ``target_ongoing_requests=4``. Reports: cold start (first request sent at zero
replicas until its response), time from the start of the heavy phase until 4 replicas
run, time from the end of the load until zero replicas, and failed requests (must be 0).

    python -m benchmarks.autoscaling [--clients 16] [--heavy 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from collections.abc import Callable

import httpx

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import app_toolkit as tk
from benchmarks.http_overhead import free_port
from benchmarks.scaling_app import SCALING, app


def running_replicas() -> int:
    return tk.status().applications["scalebench"].deployments["Ingress"].running_replicas


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
    args = parser.parse_args()
    port = free_port()
    tk.start(backend="ray", http_options={"port": port, "access_log": False})
    base = f"http://127.0.0.1:{port}"
    try:
        tk.run(app, name="scalebench")
        assert running_replicas() == 0, "the deployment should start with zero replicas"
        started = time.monotonic()
        httpx.get(base + "/work", params={"seconds": 0}, timeout=120).raise_for_status()
        cold_start = time.monotonic() - started

        reached: list[float | None] = []
        watcher = threading.Thread(
            target=lambda: reached.append(
                wait_until(lambda: running_replicas() >= SCALING["max_replicas"], args.heavy)
            )
        )
        watcher.start()
        ok, failed = asyncio.run(heavy(base, args.clients, args.heavy))
        watcher.join()
        to_zero = wait_until(lambda: running_replicas() == 0, 120)
        print(f"cold start (0 -> first response): {cold_start:.2f} s")
        print(
            f"heavy load, {args.clients} clients: {SCALING['max_replicas']} replicas after "
            + (f"{reached[0]:.2f} s" if reached and reached[0] is not None else "never (within the phase)")
        )
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
