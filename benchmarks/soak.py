"""Chaos soak: mixed traffic on a multi-node local Ray cluster while processes of every
kind are killed on a seeded schedule, and every request is judged.

A head node and ``--workers`` worker nodes (``ray.cluster_utils.Cluster``, all on
127.0.0.1, sharing the proxies' port) serve three applications (``soak_apps``): an
ingress app with GETs, uploads, SSE, resumable SSE on a Redis event log and WebSockets;
a deployment called through a handle; the LLM module's OpenAI app, with a model on the
echo engine and SmolLM2 on the transformers engine. Clients (``soak_traffic``,
``soak_streams``) send all of it at once and check everything they get back: upload
digests, event numbers, every word of a streamed chat reply (the echo's prompt, or
SmolLM2's greedy reply as it was made before the kills), and the longest stall of each
streamed reply (reported apart for those a model replica's kill met).

Every ``uniform(--kill-min, --kill-max)`` seconds one of these dies (``soak_kills``),
the kinds dealt in shuffled rounds: an ingress replica, a model replica, a node's proxy,
the controller, a worker node (its raylet and all on it; a new node joins), the reply
store's Redis (started again, empty). The schedule is printed and written as JSON;
``--replay FILE`` repeats one. The last ``--spare-last`` seconds (7 minutes) kill no
controller or proxy, so that those roles' processes live long enough for the figures
below (a worker node's kill still takes its proxy).

Each request ends intact or explained by a documented rule (``soak_rules``); anything
else is printed in full. The budget: 0 unexplained, 0 corrupted or repeated stream data,
0 resets while the node's proxy lives, >= 95 % of the requests not in flight at a kill
intact; RSS, open file descriptors and asyncio tasks per role flat over the processes
alive for ``--steady`` seconds or more. An LLM reply's failure is never explained by its
model replica's kill: it goes on on another (docs/llm.md).

    python -m benchmarks.soak [--duration 1800] [--seed 1] [--kill-min 10] [--kill-max 30]
                              [--spare-last 420] [--replay soak-schedule.json]
                              [--report soak-report.json]
"""

from __future__ import annotations

import os

# Every node and the driver on 127.0.0.1, as tests/integration/multinode_scenario.py has it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

import argparse
import asyncio
import json
import logging
import sys
import threading
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

import app_toolkit as tk
from benchmarks.http_overhead import free_port
from benchmarks.soak_apps import LLM_PREFIX, handle_app, ingress_app, llm_app
from benchmarks.soak_kills import Killer, RedisServer
from benchmarks.soak_processes import ProxyFinder
from benchmarks.soak_report import Samples, print_summary, report
from benchmarks.soak_rules import Kill, Record, judge
from benchmarks.soak_schedule import Schedule, make_schedule
from benchmarks.soak_streams import (
    chat_exchange,
    completion_exchange,
    resumable_exchange,
    smol_exchange,
    smol_references,
    websocket_loop,
)
from benchmarks.soak_traffic import (
    Traffic,
    handle_loop,
    http_exchange,
    run_loop,
    sse_exchange,
    upload_exchange,
)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=1800, help="seconds of traffic")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kill-min", type=float, default=10, help="shortest gap between kills, s")
    parser.add_argument("--kill-max", type=float, default=30, help="longest gap between kills, s")
    parser.add_argument(
        "--spare-last",
        type=float,
        default=420,
        help="the last seconds kill no controller or proxy (their processes' figures), s",
    )
    parser.add_argument("--replay", help="a schedule a previous run wrote: repeat its kills")
    parser.add_argument("--workers", type=int, default=1, help="worker nodes besides the head")
    parser.add_argument("--steady", type=float, default=300, help="compare processes alive this long, s")
    parser.add_argument("--sample-every", type=float, default=30, help="seconds between process samples")
    parser.add_argument("--schedule-out", default="soak-schedule.json")
    parser.add_argument("--report", default="soak-report.json")
    return parser.parse_args()


def _kill_on_schedule(killer: Killer, schedule: Schedule, kills: list[Kill], start: float) -> None:
    """The schedule's kills, on this (the main) thread, each at its time or, when the
    recovery from the last one took longer, as soon after as it can."""
    for planned in schedule.kills:
        time.sleep(max(0.0, start + planned.at_s - time.monotonic()))
        if time.monotonic() >= start + schedule.duration_s:
            return
        try:
            kill, said = killer.kill(planned)
        except Exception as exc:  # noqa: BLE001 - a soak goes on; the report counts what was made
            print(f"[{time.monotonic() - start:7.1f} s] no {planned.kind} kill: {type(exc).__name__}: {exc}")
            continue
        kills.append(kill)
        print(f"[{kill.started - start:7.1f} s] killed {said}", flush=True)


async def _watch_proxies(traffic: Traffic) -> None:
    """Keep the proxies' pids current (a killed proxy comes back with a new one)."""
    while not traffic.done():
        try:
            await asyncio.to_thread(traffic.proxies.refresh)
        except Exception:  # noqa: BLE001 - the controller may be restarting; next time
            pass
        await asyncio.sleep(2)


async def _traffic(
    traffic: Traffic,
    handle: tk.DeploymentHandle,
    references: dict[str, str],
    samples: Samples,
    every_s: float,
) -> None:
    await asyncio.to_thread(traffic.proxies.refresh)
    await asyncio.gather(
        *(run_loop(traffic, "http", http_exchange(traffic), n) for n in range(2)),
        run_loop(traffic, "upload", upload_exchange(traffic), 0),
        run_loop(traffic, "sse", sse_exchange(traffic), 0),
        *(run_loop(traffic, "resumable", resumable_exchange(traffic), n) for n in range(2)),
        websocket_loop(traffic, 0),
        handle_loop(traffic, handle),
        *(run_loop(traffic, "chat", chat_exchange(traffic), n) for n in range(2)),
        run_loop(traffic, "completion", completion_exchange(traffic), 0),
        run_loop(traffic, "smol", smol_exchange(traffic, references), 0),
        _watch_proxies(traffic),
        samples.run(traffic.end, every_s),
    )
    await asyncio.sleep(5)  # quiet: what is left now is held, not in flight
    await samples.take()


def _soak(
    args: argparse.Namespace,
    schedule: Schedule,
    killer: Killer,
    port: int,
    handle: tk.DeploymentHandle,
    references: dict[str, str],
) -> tuple[list[Record], list[Kill], Samples, float]:
    """The traffic on a thread of its own, the kills on this one."""
    start = time.monotonic()
    records: list[Record] = []
    kills: list[Kill] = []
    traffic = Traffic(port, start + schedule.duration_s, records, ProxyFinder(port), args.seed)
    samples = Samples(start)
    clients = threading.Thread(
        target=asyncio.run,
        args=(_traffic(traffic, handle, references, samples, args.sample_every),),
        name="soak-traffic",
    )
    clients.start()
    _kill_on_schedule(killer, schedule, kills, start)
    clients.join()
    return records, kills, samples, start


def _wait(condition: object, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.5)


def main() -> None:
    args = _arguments()
    schedule = (
        Schedule.load(args.replay)
        if args.replay
        else make_schedule(
            args.seed, args.duration, args.kill_min, args.kill_max, spare_last_s=args.spare_last
        )
    )
    print(schedule.describe(), flush=True)
    Path(args.schedule_out).write_text(schedule.to_json())
    print(
        f"schedule written to {args.schedule_out} (repeat it with --replay {args.schedule_out})", flush=True
    )
    redis = RedisServer()
    redis.start()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    try:
        ray.init(
            address=cluster.address,
            _node_ip_address="127.0.0.1",
            logging_level=logging.WARNING,
            log_to_driver=False,  # the processes' logs stay in Ray's session folder
            include_dashboard=False,
        )
        killer = Killer(cluster, redis, ray.get_runtime_context().get_node_id())
        for _ in range(args.workers):
            killer.add_worker()
        port = free_port()
        tk.start(http_options={"port": port, "access_log": False})
        tk.run(ingress_app(redis.url), name="soak", route_prefix="/")
        handle = tk.run(handle_app(), name="soakh", route_prefix=None)
        tk.run(llm_app(), name="llm", route_prefix=LLM_PREFIX)
        _wait(lambda: len(tk.status().proxies) == 1 + args.workers, "a proxy on every node")
        references = smol_references(f"http://127.0.0.1:{port}")
        records, kills, samples, start = _soak(args, schedule, killer, port, handle, references)
    finally:
        try:
            tk.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()  # type: ignore[no-untyped-call]  # ray's test Cluster is unannotated
            redis.stop()
    verdict = judge(records, kills)  # records: every request, kept for the stalls too
    print_summary(verdict, records, kills, samples, args.steady, start)
    written = report(args, schedule, verdict, records, kills, samples, start)
    Path(args.report).write_text(json.dumps(written, indent=1))
    print(f"report written to {args.report}")
    sys.exit(0 if verdict.passed() else 1)


if __name__ == "__main__":
    main()
