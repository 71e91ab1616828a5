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

    python -m benchmarks.chat [--duration 8] [--rate 100] [--tokens 64] [--skip-model] [--skip-echo]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import httpx

from benchmarks.http_overhead import start_servers, stop_servers
from benchmarks.proc_cpu import cpu_seconds

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
    ordered = sorted(first_token)
    return {
        "tokens": received,
        "tokens_per_s": received / elapsed,
        "ttft_p50_ms": 1000 * ordered[len(ordered) // 2],
        "ttft_p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
    }


def echo_part(args: argparse.Namespace) -> None:
    os.environ["CHAT_BACKEND"] = "echo"
    os.environ["CHAT_ECHO_TOKENS_PER_S"] = str(args.rate)
    servers, bases = start_servers(
        "benchmarks.chat_app:fastapi_app", "examples.chat.chat.app:app", "/v1/models", access_log=True
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
        engine._decoder._max_batch_size = batch  # the same model, decoded together or one at a time
        for chats in (1, 4, 8):
            row[chats] = await model_load(engine, chats, 48)
    for chats in (1, 4, 8):
        batched, single = results[8][chats], results[1][chats]
        print(
            f"{chats} chats: batched {batched:6.1f} tok/s | one at a time {single:6.1f} tok/s "
            f"| {batched / single:.2f}x"
        )
    await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=8, help="seconds per load run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per server and concurrency")
    parser.add_argument("--rate", type=float, default=100, help="echo tokens per second per reply")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per echo reply")
    parser.add_argument("--skip-model", action="store_true", help="only the echo part")
    parser.add_argument("--skip-echo", action="store_true", help="only the model part")
    args = parser.parse_args()
    if not args.skip_echo:
        echo_part(args)
    if not args.skip_model:
        asyncio.run(model_part())


if __name__ == "__main__":
    main()
