"""Streamed chat: time to first token and aggregate tokens/s, toolkit against bare uvicorn;
and the local model's aggregate tokens/s, batched against one chat at a time.

Echo part: the chat example (``examples/chat``, default settings, echo backend at a fixed
``--rate`` of tokens per second per reply) under ``app-toolkit run`` on an embedded Ray,
against the same echo generator in one FastAPI route under bare uvicorn
(``benchmarks/chat_app.py``). N = 1, 8, 32 clients each stream replies of ``--tokens``
tokens back to back for ``--duration`` seconds; besides tokens/s and TTFT it prints the
server's CPU time per token (every process of the server, from /proc). Model part: SmolLM2-135M on this
machine's CPU, in process, 1, 4 and 8 concurrent replies of 48 tokens, with the decoder's
batch size 8 (the example's default) and 1.

Cancellation part: the chat example with SmolLM2 (default settings but one model replica,
``CHAT_MAX_MODEL_REPLICAS=1``, so ``/api/stats`` always reads the replica measured) under
``app-toolkit run``; for each state a reply can be in — queued behind a full batch, in
prefill (a long prompt), decoding alone, decoding in a batch with 7 others, a non-streamed
request, a page reply stopped with Stop — the client disconnects (or sends Stop), and the
time until the model's batch place is free (``/api/stats`` ``active`` back down, polled
every 5 ms) is taken ``--cancel-runs`` times, after one not counted (a warm-up, as the
other parts have); p50, p99 and the worst are printed.
A run during which a reply keeping the batch busy ended (and was started again) is
measured again.

Page-replies part: the page's replies (``POST /api/replies``, then their events over SSE)
from 32 clients with the echo backend (``--replies-rate`` tokens/s per reply: more than
the server relays, so the figures are its capacity), with 1 and 3 ``Replies`` replicas, the replies kept
in memory and in Redis (a redis-server on 127.0.0.1 the script starts): replies/s,
tokens/s and server CPU per token (Redis's own CPU not included).

    python -m benchmarks.chat [--duration 8] [--rate 100] [--tokens 64] [--cancel-runs 20]
        [--skip-model] [--skip-echo] [--skip-replies] [--skip-cancel]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.http_overhead import BIN, ROOT, free_port, start_servers, stop_servers, wait_ready
from benchmarks.percentile import percentile
from benchmarks.proc_cpu import cpu_seconds
from benchmarks.startup import stop

CONCURRENCY = (1, 8, 32)
# Questions with long answers: every reply runs its full length, so the batch stays full.
QUESTIONS = [
    f"Write a long story about {topic}."
    for topic in ("a dragon", "the sea", "a robot", "a city", "a cat", "the moon", "a forest", "a train")
]


def measured_load(
    base: str, server_pid: int, clients: int, tokens: int, duration_s: float
) -> dict[str, float]:
    """``chat_load`` plus the server's CPU time per token (all its processes, from /proc)."""
    before = cpu_seconds(server_pid)
    result = asyncio.run(chat_load(base, clients, tokens, duration_s))
    spent = cpu_seconds(server_pid) - before
    result["cpu_us_per_token"] = 1e6 * spent / result["tokens"]
    return result


async def chat_load(base: str, clients: int, tokens: int, duration_s: float) -> dict[str, float]:
    prompt = " ".join(f"t{i}" for i in range(tokens))
    body = {"model": "echo", "stream": True, "messages": [{"role": "user", "content": prompt}]}
    first_token: list[float] = []
    received = 0
    deadline = time.monotonic() + duration_s

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal received
        while time.monotonic() < deadline:
            start = time.monotonic()
            seen = 0
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if line.startswith('data: {"id"') and '"content": "t' in line:
                        if seen == 0:
                            first_token.append(time.monotonic() - start)
                        seen += 1
            if seen != tokens:
                raise RuntimeError(f"a reply ended after {seen} of {tokens} tokens")
            received += seen

    started = time.monotonic()
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    elapsed = time.monotonic() - started
    return {
        "tokens": received,
        "tokens_per_s": received / elapsed,
        "ttft_p50_ms": 1000 * percentile(first_token, 0.5, math.nan),
        "ttft_p99_ms": 1000 * percentile(first_token, 0.99, math.nan),
    }


def echo_part(args: argparse.Namespace) -> None:
    os.environ["CHAT_BACKEND"] = "echo"
    os.environ["CHAT_ECHO_TOKENS_PER_S"] = str(args.rate)
    servers, bases = start_servers(
        "benchmarks.chat_app:fastapi_app",
        "examples.chat.chat.app:app",
        "/v1/models",
        access_log=True,
        uvicorns={"uvicorn": args.uvicorn_access_log},
    )
    try:
        for name in bases:  # warm up both
            asyncio.run(chat_load(bases[name], 4, args.tokens, 2))
        print(f"echo backend, {args.rate:g} tokens/s per reply, {args.tokens} tokens per reply")
        for clients in CONCURRENCY:
            runs: dict[str, list[dict[str, float]]] = {"uvicorn": [], "toolkit": []}
            for _ in range(args.rounds):
                for name in runs:
                    pid = servers[name].pid
                    runs[name].append(measured_load(bases[name], pid, clients, args.tokens, args.duration))
            bare = {key: statistics.median(run[key] for run in runs["uvicorn"]) for key in runs["uvicorn"][0]}
            ours = {key: statistics.median(run[key] for run in runs["toolkit"]) for key in runs["toolkit"][0]}
            print(
                f"N={clients:<3} uvicorn {bare['tokens_per_s']:7.0f} tok/s "
                f"TTFT p50 {bare['ttft_p50_ms']:6.1f} "
                f"p99 {bare['ttft_p99_ms']:6.1f} ms | toolkit {ours['tokens_per_s']:7.0f} tok/s TTFT p50 "
                f"{ours['ttft_p50_ms']:6.1f} p99 {ours['ttft_p99_ms']:6.1f} ms | tokens/s "
                f"{ours['tokens_per_s'] / bare['tokens_per_s']:.2f}x, TTFT p50 "
                f"{ours['ttft_p50_ms'] / bare['ttft_p50_ms']:.2f}x | server CPU per token "
                f"{bare['cpu_us_per_token']:.0f} / {ours['cpu_us_per_token']:.0f} us"
            )
    finally:
        stop_servers(servers)


async def model_load(engine: Any, chats: int, tokens: int) -> float:
    """Aggregate tokens/s of ``chats`` replies of ``tokens`` tokens generated at once."""
    from examples.chat.chat.schemas import Generation

    async def one(index: int) -> None:
        question = QUESTIONS[index % len(QUESTIONS)]
        generation = Generation((("user", question),), max_tokens=tokens, temperature=0)
        async for _ in engine.stream(generation):
            pass

    before = engine.stats()["tokens"]
    started = time.monotonic()
    await asyncio.gather(*(one(index) for index in range(chats)))
    return (engine.stats()["tokens"] - before) / (time.monotonic() - started)


async def model_part() -> None:
    from examples.chat.chat.engines.local import LocalEngine
    from examples.chat.chat.settings import Settings

    engine = LocalEngine(Settings(backend="local"))
    engine.load()
    await model_load(engine, 2, 4)  # warm up
    print("SmolLM2-135M-Instruct on the CPU, in process, 48 tokens per reply, aggregate tokens/s")
    results: dict[int, dict[int, float]] = {8: {}, 1: {}}
    for batch, row in results.items():
        engine._engine._decoder._max_batch_size = batch  # the same model, decoded together or one at a time
        for chats in (1, 4, 8):
            row[chats] = await model_load(engine, chats, 48)
    for chats in (1, 4, 8):
        batched, single = results[8][chats], results[1][chats]
        print(
            f"{chats} chats: batched {batched:6.1f} tok/s | one at a time {single:6.1f} tok/s "
            f"| {batched / single:.2f}x"
        )
    await engine.close()


LONG_PROMPT = " ".join(["Tell me everything you know about the history of the world."] * 60)
POLL_S = 0.005


def chat_body(text: str, *, stream: bool = True, max_tokens: int = 400) -> dict[str, Any]:
    return {
        "model": "SmolLM2-135M-Instruct",
        "stream": stream,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": text}],
    }


async def active(client: httpx.AsyncClient) -> int:
    """Replies the model replica holds a place for: decoding, reading their prompt, queued."""
    return int((await client.get("/api/stats")).json()["active"])


async def freed_after(client: httpx.AsyncClient, target: int, since: float) -> float:
    """Seconds from ``since`` until the model holds ``target`` replies (at most 30 s)."""
    deadline = since + 30
    while await active(client) > target:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the model still holds more than {target} replies after 30 s")
        await asyncio.sleep(POLL_S)
    return time.monotonic() - since


async def arrived(client: httpx.AsyncClient, others: int) -> None:
    """Until the model holds one reply more than the ``others``."""
    while await active(client) <= others:
        await asyncio.sleep(POLL_S)


@dataclass
class Background:
    """Long replies that keep ``count`` batch places busy; ``restarts`` counts the ones
    that ended (and were started again)."""

    count: int
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    restarts: int = 0

    async def start(self, client: httpx.AsyncClient) -> None:
        async def forever(index: int) -> None:
            while True:
                body = chat_body(QUESTIONS[index % len(QUESTIONS)], max_tokens=1500)
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    async for _ in response.aiter_lines():
                        pass
                self.restarts += 1

        self.tasks = [asyncio.create_task(forever(index)) for index in range(self.count)]
        deadline = time.monotonic() + 120
        while await active(client) < self.count:  # every one has its place
            if time.monotonic() > deadline:
                raise RuntimeError("the background replies never all started")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # past their prefill: decoding

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def cancel_once(client: httpx.AsyncClient, state: str, others: int) -> float:
    """One cancellation in ``state``; seconds until the model holds ``others`` replies."""
    if state in ("decode alone", "decode, batched with 7"):
        body = chat_body("Write a long story about a dragon.")
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            seen = 0
            async for line in response.aiter_lines():
                seen += line.startswith("data: {")
                if seen > 5:  # the role chunk, then 5 pieces
                    break
        return await freed_after(client, others, time.monotonic())  # the connection dropped
    if state in ("queued", "prefill", "non-streamed"):
        prompt = {"queued": "Write a long story about the sea.", "prefill": LONG_PROMPT}.get(
            state, "Write a long story about a robot."
        )
        body = chat_body(prompt, stream=state != "non-streamed")
        request = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await arrived(client, others)  # queued, or reading its prompt
        await asyncio.sleep(0.5 if state == "non-streamed" else 0.05)  # non-streamed: decoding
        request.cancel()  # the client drops its connection
        since = time.monotonic()
        with contextlib.suppress(asyncio.CancelledError):
            await request
        return await freed_after(client, others, since)
    if state == "page reply, Stop":
        reply = await client.post("/api/replies", json=chat_body("Write a long story about a city."))
        reply_id = reply.json()["id"]
        async with client.stream("GET", f"/api/replies/{reply_id}/events") as events:
            seen = 0
            async for line in events.aiter_lines():
                seen += line.startswith("event: token")
                if seen == 5:
                    break
        since = time.monotonic()
        (await client.post(f"/api/replies/{reply_id}/stop")).raise_for_status()
        return await freed_after(client, others, since)
    raise ValueError(state)


CANCEL_STATES: dict[str, int] = {  # state -> replies decoding beside it
    "queued": 8,
    "prefill": 0,
    "decode alone": 0,
    "decode, batched with 7": 7,
    "non-streamed": 0,
    "page reply, Stop": 0,
}


@contextlib.contextmanager
def toolkit_running(target: str, env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``app-toolkit run target`` with its defaults and ``env``, answering; stopped (Ctrl-C)
    on leaving. Gives the process and its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [str(BIN / "app-toolkit"), "run", target, "--port", str(port), "--no-access-log"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", **env},
        stdout=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base + "/v1/models", process, timeout_s=180)
        yield process, base
    finally:
        stop(process, signal.SIGINT)


async def measure_state(client: httpx.AsyncClient, state: str, others: int, runs: int) -> list[float]:
    background = Background(others)
    if others:
        await background.start(client)
    try:
        await cancel_once(client, state, others)  # a warm-up, not counted
        took: list[float] = []
        while len(took) < runs:
            restarts = background.restarts
            sample = await cancel_once(client, state, others)
            if background.restarts == restarts:  # else a busy place was freed and taken meanwhile
                took.append(sample)
        return sorted(took)
    finally:
        await background.stop()
        await freed_after(client, 0, time.monotonic())


async def cancel_measurements(base: str, runs: int) -> None:
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        await client.post("/v1/chat/completions", json=chat_body("hi", stream=False, max_tokens=2))  # loaded
        print("cancellation: client disconnect (or Stop) -> the model's batch place free")
        for state, others in CANCEL_STATES.items():
            took = await measure_state(client, state, others, runs)
            p99 = percentile(took, 0.99)
            print(
                f"  {state:<24} p50 {1000 * statistics.median(took):6.1f} ms  p99 {1000 * p99:6.1f} ms  "
                f"worst {1000 * took[-1]:6.1f} ms  ({runs} runs)"
            )


def cancel_part(args: argparse.Namespace) -> None:
    # One model replica: the autoscaler would add a second under the queued state's 9 replies,
    # and /api/stats would then answer from either.
    env = {"CHAT_BACKEND": "local", "CHAT_MAX_MODEL_REPLICAS": "1"}
    with toolkit_running("examples.chat.chat.app:app", env) as (_, base):
        asyncio.run(cancel_measurements(base, args.cancel_runs))


async def replies_load(base: str, clients: int, tokens: int, duration_s: float) -> dict[str, float]:
    """Page replies (``POST /api/replies``, then its events over SSE until ``done``), back
    to back from each client for ``duration_s``: replies and tokens per second."""
    prompt = " ".join(f"t{i}" for i in range(tokens))
    body = {"model": "echo", "messages": [{"role": "user", "content": prompt}]}
    done = received = 0
    deadline = time.monotonic() + duration_s

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal done, received
        while time.monotonic() < deadline:
            started = await client.post("/api/replies", json=body)
            started.raise_for_status()
            seen = 0
            async with client.stream("GET", f"/api/replies/{started.json()['id']}/events") as events:
                async for line in events.aiter_lines():
                    if line.startswith("event: token"):
                        seen += 1
                    elif line.startswith("event: "):
                        if line != "event: done":
                            raise RuntimeError(f"a reply ended with {line!r}")
                        break
            if seen != tokens:
                raise RuntimeError(f"a reply ended after {seen} of {tokens} tokens")
            done += 1
            received += seen

    started_at = time.monotonic()
    limits = httpx.Limits(max_connections=2 * clients)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    elapsed = time.monotonic() - started_at
    return {"replies_per_s": done / elapsed, "tokens_per_s": received / elapsed, "tokens": received}


def replies_part(args: argparse.Namespace) -> None:
    from tests.redis_server import redis_server

    clients, tokens = 32, args.tokens
    print(
        f"page replies (Replies deployment), echo backend at {args.replies_rate:g} tokens/s per reply, "
        f"{tokens} tokens per reply, {clients} clients back to back"
    )
    with redis_server() as url:
        for store, replicas in (("memory", 1), ("memory", 3), ("redis", 1), ("redis", 3)):
            env = {
                "CHAT_BACKEND": "echo",
                "CHAT_ECHO_TOKENS_PER_S": str(args.replies_rate),
                "CHAT_REPLY_STORE": store,
                "CHAT_REDIS_URL": url,
                "CHAT_REPLY_REPLICAS": str(replicas),
            }
            with toolkit_running("examples.chat.chat.app:app", env) as (process, base):
                asyncio.run(replies_load(base, 4, tokens, 2))  # warm-up
                runs = []
                for _ in range(args.rounds):
                    before = cpu_seconds(process.pid)
                    run = asyncio.run(replies_load(base, clients, tokens, args.duration))
                    run["cpu_us_per_token"] = 1e6 * (cpu_seconds(process.pid) - before) / run["tokens"]
                    runs.append(run)
            median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            print(
                f"  {store:<6} x{replicas} Replies replicas: {median['replies_per_s']:6.1f} replies/s "
                f"{median['tokens_per_s']:7.0f} tokens/s | server CPU per token "
                f"{median['cpu_us_per_token']:.0f} us"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=8, help="seconds per load run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per server and concurrency")
    parser.add_argument("--rate", type=float, default=100, help="echo tokens per second per reply")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per echo reply")
    parser.add_argument("--skip-model", action="store_true", help="no in-process model part")
    parser.add_argument("--skip-echo", action="store_true", help="no echo part")
    parser.add_argument("--skip-cancel", action="store_true", help="no cancellation part")
    parser.add_argument("--skip-replies", action="store_true", help="no page-replies part")
    parser.add_argument(
        "--replies-rate", type=float, default=1000, help="echo tokens/s per reply in the page-replies part"
    )
    parser.add_argument(
        "--uvicorn-access-log",
        action="store_true",
        help="run uvicorn with its default access log (to /dev/null), not --no-access-log",
    )
    parser.add_argument("--cancel-runs", type=int, default=20, help="cancellations per state")
    args = parser.parse_args()
    if not args.skip_echo:
        echo_part(args)
    if not args.skip_model:
        asyncio.run(model_part())
    if not args.skip_replies:
        replies_part(args)
    if not args.skip_cancel:
        cancel_part(args)


if __name__ == "__main__":
    main()
