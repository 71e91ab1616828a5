"""Soak: mixed traffic for a long while, with a replica killed every few minutes.

Runs in this process on an embedded Ray (``tk.run``): an HTTP app on two replicas and a
handle-only deployment on two (``benchmarks/overload_app.py``), and at once:

- HTTP GETs that burn 1 ms of CPU (closed loop), SSE streams of 20 events, WebSocket
  echo sessions, handle calls, and clients that leave in the middle of a stream;
- every ``--kill-every`` seconds a SIGKILL to one replica (alternating between the two
  deployments, processes this script started).

It prints, per kind of traffic, what succeeded and what failed, and sorts failures into
those a kill explains (502 / RequestLostError while the killed replica had them, within a
few seconds of a kill) and the rest, which must be none. Every 30 s it samples each
toolkit process's RSS and open file descriptors; at the end (after a quiet moment) it
compares them, and the asyncio tasks of the proxy and replicas, with their values after
warm-up.

    python -m benchmarks.soak [--duration 1800] [--kill-every 300] [--warmup 120]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import ray
from websockets.asyncio.client import connect

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import (
    NAMESPACE,
    PROXY_PREFIX,
    REPLICA_PREFIX,
    SPARE_PREFIX,
    replica_actor,
)
from benchmarks.http_overhead import free_port
from benchmarks.loadgen import Client
from benchmarks.overload_app import soak_handles, soak_http
from benchmarks.proc_cpu import _rss_mb, open_fds

KILL_GRACE_S = 5.0  # failures this soon after a kill may be the killed replica's requests


@dataclass
class Ledger:
    ok: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[float, str, str]] = field(default_factory=list)  # (when, kind, what)
    kills: list[float] = field(default_factory=list)

    def fail(self, kind: str, what: str) -> None:
        self.failures.append((time.monotonic(), kind, what))

    def explained(self, when: float, what: str) -> bool:
        """A failure a kill explains: the killed replica had the request (502, or 503 when
        it had read but not run it), or a stream it was sending was cut. A reset or a
        timeout never is."""
        lost = what.startswith(("502", "503")) or "RequestLostError" in what or "lost" in what.lower()
        return lost and any(0 <= when - kill <= KILL_GRACE_S for kill in self.kills)


async def http_loop(ledger: Ledger, port: int, end: float) -> None:
    client = Client("127.0.0.1", port)
    while time.monotonic() < end:
        outcome = await client.get("/work?ms=1")
        if outcome.status == 200:
            ledger.ok["http"] += 1
        else:
            ledger.fail("http", f"{outcome.status} {outcome.error}")
    client.close()


async def sse_loop(ledger: Ledger, base: str, end: float) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        while time.monotonic() < end:
            try:
                async with client.stream("GET", "/stream", params={"events": 20}) as response:
                    if response.status_code != 200:
                        ledger.fail("sse", str(response.status_code))
                        continue
                    events = [line async for line in response.aiter_lines() if line.startswith("data:")]
                if len(events) == 20:
                    ledger.ok["sse"] += 1
                else:
                    ledger.fail("sse", f"{len(events)} of 20 events (stream lost)")
            except httpx.HTTPError as exc:
                ledger.fail("sse", f"{type(exc).__name__}: {exc} (stream lost)")


async def leaving_loop(ledger: Ledger, base: str, end: float) -> None:
    """Clients that go away mid-stream: not failures, but the server must clean up."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        while time.monotonic() < end:
            try:
                async with client.stream("GET", "/stream", params={"events": 200}) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: 3"):
                            break
                ledger.ok["left mid-stream"] += 1
            except httpx.HTTPError as exc:
                ledger.fail("left mid-stream", f"{type(exc).__name__}: {exc} (stream lost)")


async def websocket_loop(ledger: Ledger, port: int, end: float) -> None:
    while time.monotonic() < end:
        try:
            async with connect(f"ws://127.0.0.1:{port}/echo") as socket:
                for number in range(10):
                    await socket.send(str(number))
                    if await asyncio.wait_for(socket.recv(), 30) != str(number):
                        raise RuntimeError("wrong echo")
            ledger.ok["websocket"] += 1
        except Exception as exc:  # noqa: BLE001 - every failure is recorded and judged later
            ledger.fail("websocket", f"{type(exc).__name__}: {exc} (lost)")


async def handle_loop(ledger: Ledger, handle: tk.DeploymentHandle, end: float) -> None:
    number = 0
    while time.monotonic() < end:
        number += 1
        try:
            if await handle.add.remote(number, 1) == number + 1:
                ledger.ok["handle"] += 1
            else:
                ledger.fail("handle", "wrong result")
        except Exception as exc:  # noqa: BLE001 - every failure is recorded and judged later
            ledger.fail("handle", f"{type(exc).__name__}: {exc}")


def replica_pids(app: str) -> dict[str, int]:
    pids = {}
    for deployment in tk.status().applications[app].deployments.values():
        for replica in deployment.replicas:
            if replica.state is tk.ReplicaState.RUNNING:
                actor = replica_actor(replica.replica_id)
                pids[replica.replica_id] = ray.get(actor.stats.remote(), timeout=30)["pid"]
    return pids


async def killer(ledger: Ledger, every_s: float, end: float) -> None:
    apps = ["soak", "soakh"]
    while time.monotonic() + every_s < end:
        await asyncio.sleep(every_s)
        app = apps[len(ledger.kills) % 2]
        try:
            replica_id, pid = sorted((await asyncio.to_thread(replica_pids, app)).items())[0]
        except Exception as exc:  # noqa: BLE001 - a soak goes on; the next kill tries again
            print(f"could not find a replica of {app} to kill: {exc}", flush=True)
            continue
        ledger.kills.append(time.monotonic())
        os.kill(pid, signal.SIGKILL)
        print(f"[{time.strftime('%H:%M:%S')}] killed replica {replica_id} (pid {pid})", flush=True)


def actor_stats() -> dict[str, dict[str, int]]:
    """Tasks and pid of every toolkit proxy and replica actor."""
    found = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"]
        if actor["namespace"] == NAMESPACE and name.startswith((PROXY_PREFIX, REPLICA_PREFIX, SPARE_PREFIX)):
            try:
                found[name] = ray.get(ray.get_actor(name, namespace=NAMESPACE).stats.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - one being replaced right now
                continue
    return found


def sample() -> dict[int, tuple[str, float, int]]:
    """pid -> (actor name, RSS in MB, open file descriptors)."""
    return {
        stats["pid"]: (name, _rss_mb(stats["pid"]), open_fds(stats["pid"]))
        for name, stats in actor_stats().items()
    }


async def sampler(samples: list[tuple[float, dict[int, tuple[str, float, int]]]], end: float) -> None:
    while time.monotonic() < end:
        samples.append((time.monotonic(), await asyncio.to_thread(sample)))
        await asyncio.sleep(30)


async def soak(args: argparse.Namespace, port: int, handle: tk.DeploymentHandle) -> Ledger:
    ledger = Ledger()
    base = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    end = start + args.duration
    samples: list[tuple[float, dict[int, tuple[str, float, int]]]] = []
    await asyncio.gather(
        *(http_loop(ledger, port, end) for _ in range(4)),
        *(sse_loop(ledger, base, end) for _ in range(2)),
        leaving_loop(ledger, base, end),
        websocket_loop(ledger, port, end),
        *(handle_loop(ledger, handle, end) for _ in range(2)),
        killer(ledger, args.kill_every, end),
        sampler(samples, end),
    )
    await asyncio.sleep(5)  # quiet: what is left now is held, not in flight
    samples.append((time.monotonic(), await asyncio.to_thread(sample)))
    warm = next((s for t, s in samples if t - start >= args.warmup), samples[0][1])
    last = samples[-1][1]
    print("\nper process, after warm-up -> at the end (RSS, open file descriptors):")
    for pid, (name, rss, fds) in sorted(last.items(), key=lambda item: item[1][0]):
        first = warm.get(pid) or next(s[pid] for _, s in samples if pid in s)  # a replacement
        growth = (rss - first[1]) / first[1] * 100 if first[1] else 0.0
        print(f"  {name}: RSS {first[1]:.0f} -> {rss:.0f} MB ({growth:+.1f} %), fds {first[2]} -> {fds}")
    print("asyncio tasks at the end (after 5 s of quiet):")
    for name, stats in sorted((await asyncio.to_thread(actor_stats)).items()):
        print(f"  {name}: {stats['tasks']} tasks, {stats.get('ongoing', 0)} requests running")
    return ledger


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=1800)
    parser.add_argument("--kill-every", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=120)
    args = parser.parse_args()
    port = free_port()
    tk.start(http_options={"port": port, "access_log": False})
    tk.run(soak_http, name="soak", route_prefix="/")
    handle = tk.run(soak_handles, name="soakh", route_prefix=None)
    try:
        ledger = asyncio.run(soak(args, port, handle))
    finally:
        tk.shutdown()
    unexplained = [
        (when, kind, what) for when, kind, what in ledger.failures if not ledger.explained(when, what)
    ]
    print(f"\n{args.duration} s, {len(ledger.kills)} replica kills")
    print("succeeded: " + ", ".join(f"{kind} {count}" for kind, count in sorted(ledger.ok.items())))
    explained = len(ledger.failures) - len(unexplained)
    print(f"failed: {explained} while a killed replica had them, {len(unexplained)} otherwise")
    for _when, kind, what in unexplained[:20]:
        print(f"  {kind}: {what}")
    sys.exit(1 if unexplained else 0)


if __name__ == "__main__":
    main()
