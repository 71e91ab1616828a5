"""Streaming: SSE and WebSocket latency and throughput, toolkit against bare uvicorn.

Same route code in both (``benchmarks/stream_app.py``). SSE: 16 concurrent clients, each
reading streams of 100 events for ``--duration`` seconds: streams/s, events/s and time to
first event (p50/p99), once on an ingress route and once on a route in its own replica
pool (``@tk.replicated``; a plain route under uvicorn). WebSocket: 1,000 sequential echo
round trips on one connection (p50/p99). Prints ratios toolkit/uvicorn (medians over rounds)
for the toolkit started both ways users start it, ``app-toolkit run`` and a script calling
``tk.run`` (``benchmarks/toolkit_modes.py``; ``--no-python-api`` leaves the second out).

    python -m benchmarks.streaming [--duration 10] [--rounds 2] [--no-python-api]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx
from websockets.sync.client import connect

from benchmarks.http_overhead import start_servers, stop_servers
from benchmarks.percentile import percentile
from benchmarks.proc_cpu import cpu_seconds
from benchmarks.toolkit_modes import LABELS, add_mode_arguments, chosen_modes, describe

CLIENTS = 16
EVENTS = 100
ROUND_TRIPS = 1000


async def sse_load(base: str, duration_s: float, path: str = "/sse") -> dict[str, float]:
    first_event: list[float] = []
    streams = 0
    deadline = time.monotonic() + duration_s

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal streams
        while time.monotonic() < deadline:
            start = time.monotonic()
            seen = 0
            async with client.stream("GET", path, params={"events": EVENTS}) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        if seen == 0:
                            first_event.append(time.monotonic() - start)
                        seen += 1
            if seen != EVENTS:
                raise RuntimeError(f"stream ended after {seen} of {EVENTS} events")
            streams += 1

    started = time.monotonic()
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(CLIENTS)))
    elapsed = time.monotonic() - started
    return {
        "events": streams * EVENTS,
        "streams_per_s": streams / elapsed,
        "events_per_s": streams * EVENTS / elapsed,
        "ttfb_p50_ms": 1000 * percentile(first_event, 0.5, math.nan),
        "ttfb_p99_ms": 1000 * percentile(first_event, 0.99, math.nan),
    }


def websocket_round_trips(base: str) -> dict[str, float]:
    timings = []
    with connect(base.replace("http://", "ws://") + "/echo") as ws:
        for _ in range(50):  # warm up
            ws.send("x")
            ws.recv()
        for i in range(ROUND_TRIPS):
            start = time.perf_counter()
            ws.send(f"message {i}")
            ws.recv()
            timings.append(time.perf_counter() - start)
    return {
        "events": ROUND_TRIPS,
        "rtt_p50_ms": 1000 * percentile(timings, 0.5),
        "rtt_p99_ms": 1000 * percentile(timings, 0.99),
    }


def sse_run(base: str, duration_s: float, path: str = "/sse") -> dict[str, float]:
    return asyncio.run(sse_load(base, duration_s, path))


def with_cpu(server_pid: int, load: Callable[..., dict[str, float]], *args: Any) -> dict[str, float]:
    """``load(*args)``'s figures and the CPU the server's process tree spent per event (µs)."""
    before = cpu_seconds(server_pid)
    figures = load(*args)
    figures["cpu_us"] = (cpu_seconds(server_pid) - before) * 1e6 / max(figures.pop("events"), 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    add_mode_arguments(parser)
    args = parser.parse_args()
    modes = chosen_modes(args)
    print(describe(modes, "benchmarks.stream_app:app"), flush=True)
    servers, bases = start_servers(
        "benchmarks.stream_app:fastapi_app", "benchmarks.stream_app:app", "/health", toolkit_modes=modes
    )
    try:
        results: dict[str, list[dict[str, float]]] = {name: [] for name in ("uvicorn", *modes)}
        for name in results:  # warm up
            asyncio.run(sse_load(bases[name], 2))
        for _ in range(args.rounds):
            for name in results:
                pid, base = servers[name].pid, bases[name]
                pooled = with_cpu(pid, sse_run, base, args.duration, "/pooled/sse")
                sse = with_cpu(pid, sse_run, base, args.duration)
                echo = with_cpu(pid, websocket_round_trips, base)
                results[name].append(
                    {
                        **sse,
                        **{f"pool_{key}": value for key, value in pooled.items()},
                        **{f"ws_{key}": value for key, value in echo.items()},
                    }
                )
        medians = {
            name: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            for name, runs in results.items()
        }
        bare = medians["uvicorn"]
        print(
            f"SSE {CLIENTS} clients x {EVENTS} events: uvicorn {bare['events_per_s']:8.0f} events/s "
            f"first event p50 {bare['ttfb_p50_ms']:.2f} p99 {bare['ttfb_p99_ms']:.2f} ms "
            f"| server CPU/event {bare['cpu_us']:.0f} us"
        )
        for mode in modes:
            ours = medians[mode]
            print(
                f"  {LABELS[mode]:25} {ours['events_per_s']:8.0f} events/s first event p50 "
                f"{ours['ttfb_p50_ms']:.2f} p99 {ours['ttfb_p99_ms']:.2f} ms | throughput "
                f"{ours['events_per_s'] / bare['events_per_s']:.2f}x, first event p50 "
                f"{ours['ttfb_p50_ms'] / bare['ttfb_p50_ms']:.2f}x | server CPU/event {ours['cpu_us']:.0f} us"
            )
        print(
            f"SSE in its own pool: uvicorn {bare['pool_events_per_s']:8.0f} events/s first event p50 "
            f"{bare['pool_ttfb_p50_ms']:.2f} ms | server CPU/event {bare['pool_cpu_us']:.0f} us"
        )
        for mode in modes:
            ours = medians[mode]
            print(
                f"  {LABELS[mode]:25} {ours['pool_events_per_s']:8.0f} events/s first event p50 "
                f"{ours['pool_ttfb_p50_ms']:.2f} ms | throughput "
                f"{ours['pool_events_per_s'] / bare['pool_events_per_s']:.2f}x, first event p50 "
                f"{ours['pool_ttfb_p50_ms'] / bare['pool_ttfb_p50_ms']:.2f}x | server CPU/event "
                f"{ours['pool_cpu_us']:.0f} us"
            )
        print(
            f"WebSocket echo x{ROUND_TRIPS}: uvicorn p50 {bare['ws_rtt_p50_ms']:.3f} "
            f"p99 {bare['ws_rtt_p99_ms']:.3f} ms | server CPU/round trip {bare['ws_cpu_us']:.0f} us"
        )
        for mode in modes:
            ours = medians[mode]
            print(
                f"  {LABELS[mode]:25} p50 {ours['ws_rtt_p50_ms']:.3f} p99 {ours['ws_rtt_p99_ms']:.3f} ms "
                f"| round trip p50 {ours['ws_rtt_p50_ms'] / bare['ws_rtt_p50_ms']:.2f}x | server CPU/round "
                f"trip {ours['ws_cpu_us']:.0f} us",
                flush=True,
            )
    finally:
        stop_servers(servers)


if __name__ == "__main__":
    main()
