"""The chat model pool scaling under a burst: one replica against a pool autoscaling
1 → 3, under the request-count policy or the pool's own load policy
(``examples/chat/chat/scaling.py``).

The chat example with SmolLM2 on the CPU (``CHAT_BACKEND=local``), its model pool
between 1 and ``--max-replicas`` replicas, on an embedded Ray that counts 3 logical CPUs
so the third replica (``num_cpus=1``) can be placed: on a 2-core host the 3 replicas then
share 2 cores, and a replica loading its model takes CPU from the ones decoding. The
delays are shortened to act within the run (``--upscale-delay``, ``look_back_period_s=5``,
replicas sampling their load every 0.5 s). For each policy (``CHAT_SCALING=requests``,
the toolkit's built-in policy at ``max_batch_size`` = 8 requests per replica; ``load``)
and each largest size, one replica serves first; then ``--clients`` clients each stream
replies of up to ``--max-tokens`` tokens back to back for ``--duration`` s.

A replica admits one reply per decode slot (``max_ongoing_requests`` = the batch, 8): the
rest wait in the caller's queue. Printed per run: when each replica was decided and seen
RUNNING (seconds after the burst began); time to first token p50/p90 over all replies and
over those started once every replica ran; the replies that waited at the caller through
a replica's start (sent before it ran, first token after) and the replies each replica
started (``chat_time_to_first_token_seconds`` per replica, from ``/-/metrics``); each
reply's wait inside its replica for a decode slot (``chat_queue_wait_seconds``: at most a
decoding step when no reply waits there); tokens streamed, and the server's CPU time per
token (every process under this one but itself: Ray, proxy, ingress and model replicas,
the new replicas' model loading included).

    python -m benchmarks.chat_scaling [--clients 24] [--duration 60] [--max-tokens 128]
        [--policies load] [--max-replicas 1,3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import threading
import time
from dataclasses import dataclass, field

import httpx

from benchmarks.http_overhead import ROOT, free_port
from benchmarks.percentile import percentile
from benchmarks.proc_cpu import cpu_seconds

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray's workers import the chat example (and its policy's module) as this process does.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

import app_toolkit as tk

APP = "chatscale"
QUESTIONS = [
    f"Write a long story about {topic}."
    for topic in ("a dragon", "the sea", "a robot", "a city", "a cat", "the moon", "a forest", "a train")
]
_DECISION = re.compile(r"ChatModel: (\d+) -> (\d+) replicas")
_COMPLETION_TOKENS = re.compile(r'"completion_tokens": ?(\d+)')
_CONTENT = re.compile(r'"content": ?"[^"]')  # a chunk with text
_SAMPLE = re.compile(r"^(\w+)\{(.*)\} ([0-9.e+-]+|\+Inf)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def model_status() -> tk.DeploymentStatusInfo:
    return tk.status().applications[APP].deployments["ChatModel"]


class ReplicaWatch:
    """When the model pool's running replicas reached each count (Unix time, polled every 0.1 s)."""

    def __init__(self) -> None:
        self.running_at: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                running = model_status().running_replicas
            except KeyError:  # a status taken while the controller rewrites the tables
                running = 0
            for count in range(1, running + 1):
                self.running_at.setdefault(count, time.time())
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def decisions(since: float) -> list[tuple[float, int, int]]:
    """(Unix time, from, to) of the controller's scale-ups of the model pool since ``since``."""
    found = []
    for event in tk.status().events:
        matched = _DECISION.search(event.message)
        if matched is not None and event.time >= since and int(matched.group(2)) > int(matched.group(1)):
            found.append((event.time, int(matched.group(1)), int(matched.group(2))))
    return found


@dataclass
class Burst:
    """Each reply's start (seconds after the burst began), its time to first token, and
    the tokens streamed."""

    replies: list[tuple[float, float]] = field(default_factory=list)
    tokens: int = 0


async def burst(base: str, clients: int, max_tokens: int, duration_s: float, began: float) -> Burst:
    result = Burst()
    deadline = time.monotonic() + duration_s

    async def client_loop(client: httpx.AsyncClient, index: int) -> None:
        while time.monotonic() < deadline:
            body = {
                "model": "SmolLM2-135M-Instruct",
                "stream": True,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}],
            }
            sent = time.time()
            first = None
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                lines = []
                async for line in response.aiter_lines():
                    lines.append(line)
                    if first is None and _CONTENT.search(line):
                        first = time.time()
                    if (usage := _COMPLETION_TOKENS.search(line)) is not None:
                        result.tokens += int(usage.group(1))
            if first is None:
                raise RuntimeError(f"a reply ended without a token: {lines[-4:]}")
            result.replies.append((sent - began, first - sent))

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as client:
        await asyncio.gather(*(client_loop(client, index) for index in range(clients)))
    return result


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The chat's reply metrics in the node's ``/-/metrics``: (name, labels) -> value."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in httpx.get(base + "/-/metrics", timeout=10).text.splitlines():
        matched = _SAMPLE.match(line)
        if matched is None or not matched.group(1).startswith(
            ("chat_queue_wait_seconds", "chat_time_to_first_token_seconds_count")
        ):
            continue
        labels = tuple(sorted(_LABEL.findall(matched.group(2))))
        found[(matched.group(1), labels)] = float(matched.group(3))
    return found


def replica_report(before: dict[tuple[str, tuple[tuple[str, str], ...]], float], base: str) -> str:
    """Replies started per replica during the burst, and their waits for a decode slot."""
    after = scrape(base)
    grown = {key: value - before.get(key, 0.0) for key, value in after.items()}
    started = {
        dict(labels).get("replica", "?"): count
        for (name, labels), count in grown.items()
        if name == "chat_time_to_first_token_seconds_count" and count > 0
    }
    waits: dict[float, float] = {}  # bucket bound -> replies that waited at most that long
    for (name, labels), count in grown.items():
        if name == "chat_queue_wait_seconds_bucket":
            bound = dict(labels)["le"]
            key = float("inf") if bound == "+Inf" else float(bound)
            waits[key] = waits.get(key, 0.0) + count
    total = waits.get(float("inf"), 0.0)
    within = min((bound for bound, count in waits.items() if count >= total), default=float("inf"))
    per_replica = ", ".join(f"{count:.0f}" for _, count in sorted(started.items()))
    return (
        f"replies started per replica: {per_replica or 'none'}; waits for a decode slot inside the "
        f"replica: all {total:.0f} at most {within:g} s"
    )


def percentiles(values: list[float]) -> str:
    if not values:
        return "no replies"
    return (
        f"p50 {statistics.median(values):5.2f} s, p90 {percentile(values, 0.9):5.2f} s "
        f"({len(values)} replies)"
    )


def run_policy(policy: str, max_replicas: int, args: argparse.Namespace, base: str) -> float | None:
    """One run, printed; gives when its first scale-up was decided (s after the burst began)."""
    from examples.chat.chat.app import build_app
    from examples.chat.chat.settings import Settings

    scaling = {
        "upscale_delay_s": args.upscale_delay,
        "downscale_delay_s": 600,  # no replica leaves within the run
        "look_back_period_s": 5,
        "metrics_interval_s": 0.5,
    }
    settings = Settings(
        backend="local", max_model_replicas=max_replicas, scaling=policy, model_autoscaling=scaling
    )
    loading = time.monotonic()
    tk.run(build_app(settings), name=APP, route_prefix="/")
    loaded = time.monotonic() - loading
    print(f"{policy} policy, 1 to {max_replicas} replicas: the first replica took {loaded:.1f} s to load")
    warm = {
        "model": "SmolLM2-135M-Instruct",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
    }
    httpx.post(base + "/v1/chat/completions", json=warm, timeout=120).raise_for_status()
    time.sleep(args.look_back_settle)  # the warm-up leaves the look-back window
    counted = scrape(base)
    watch = ReplicaWatch()
    began = time.time()
    cpu_before = cpu_seconds(os.getpid()) - sum(os.times()[:2])
    result = asyncio.run(burst(base, args.clients, args.max_tokens, args.duration, began))
    server_cpu = cpu_seconds(os.getpid()) - sum(os.times()[:2]) - cpu_before
    watch.stop()
    ups = decisions(began)
    decided = ", ".join(f"{before} -> {after} at {at - began:.1f} s" for at, before, after in ups) or "none"
    running = {count: at - began for count, at in sorted(watch.running_at.items()) if count > 1}
    print(f"  scale-ups decided: {decided}")
    print(
        "  replicas RUNNING: "
        + (", ".join(f"{count} at {at:.1f} s" for count, at in running.items()) or "no replica added")
    )
    print(f"  TTFT, all replies: {percentiles([ttft for _, ttft in result.replies])}")
    if running:
        first, last = min(running.values()), max(running.values())
        before = [ttft for start, ttft in result.replies if start < first]
        after = [ttft for start, ttft in result.replies if start >= last]
        print(f"  TTFT, replies started before a replica was added: {percentiles(before)}")
        print(f"  TTFT, replies started once {max(running)} replicas ran: {percentiles(after)}")
        for count, at in running.items():
            through = sum(1 for start, ttft in result.replies if start < at <= start + ttft)
            print(f"  replies that waited at the caller while replica {count} started: {through}")
    print(f"  {replica_report(counted, base)}")
    print(
        f"  {result.tokens} tokens in {args.duration:g} s ({result.tokens / args.duration:.1f} tokens/s); "
        f"server CPU per token {1000 * server_cpu / max(result.tokens, 1):.1f} ms",
        flush=True,
    )
    tk.delete(APP)
    return ups[0][0] - began if ups else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=24, help="concurrent streams in the burst")
    parser.add_argument("--duration", type=float, default=60, help="seconds of the burst")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per reply at most")
    parser.add_argument("--upscale-delay", type=float, default=2, help="upscale_delay_s of the pool")
    parser.add_argument(
        "--look-back-settle", type=float, default=5, help="seconds idle before the burst (the look-back)"
    )
    parser.add_argument("--policies", default="load", help="CHAT_SCALING values, in order")
    parser.add_argument(
        "--max-replicas", default="1,3", help="largest pool sizes, each run under every policy"
    )
    args = parser.parse_args()
    from app_toolkit._runtime.backends.ray.cluster import init_ray

    # Room for 3 model replicas of num_cpus=1 on 2 cores; the replicas' logs stay in Ray's files.
    init_ray(None, num_cpus=3, log_to_driver=False)
    port = free_port()
    tk.start(backend="ray", http_options={"port": port, "access_log": False})
    print(
        f"chat model pool under a burst of {args.clients} streams of up to {args.max_tokens} tokens for "
        f"{args.duration:g} s; upscale_delay_s={args.upscale_delay:g}, "
        "look_back_period_s=5, metrics_interval_s=0.5 (shortened for the run); "
        f"{os.cpu_count()} cores for 3 replicas of 1 logical CPU each: they compete for the cores",
        flush=True,
    )
    try:
        first = {
            f"{policy}, 1 to {size}": run_policy(policy, int(size), args, f"http://127.0.0.1:{port}")
            for policy in args.policies.split(",")
            for size in args.max_replicas.split(",")
        }
    finally:
        tk.shutdown()
    print(
        "first scale-up decided: "
        + ", ".join(f"{policy} {'never' if at is None else f'{at:.1f} s'}" for policy, at in first.items())
    )


if __name__ == "__main__":
    main()
