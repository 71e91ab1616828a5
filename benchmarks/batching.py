"""Batching: the toolkit against bare uvicorn with the same in-process batcher.

Scenarios (concurrency 64 for the simulated device, 32 for the real model):
a device costing 2 ms + 0.05 ms per item (max 32 items, 5 ms wait) batched and unbatched,
and the all-MiniLM-L6-v2 embedding model batched and unbatched. Prints req/s, p50/p99,
mean batch size, the toolkit/uvicorn ratio and each server's CPU per request (its whole
process tree, from /proc); medians over rounds.

    python -m benchmarks.batching [--duration 10] [--rounds 2] [--only device]

Needs wrk and the `embeddings` extra (`make bench` provides both).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import httpx

from benchmarks.http_overhead import (
    Result,
    Scenario,
    lua_script,
    median,
    run_measured,
    run_wrk,
    start_servers,
    stop_servers,
)

SCENARIOS = [
    (Scenario("device batched, c=64", "/device/batched", 64), "device_batch"),
    (Scenario("device unbatched, c=64", "/device/unbatched", 64), ""),
    (Scenario("embedding batched, c=32", "/embed/batched", 32, "POST", 64), "embed_batch"),
    (Scenario("embedding unbatched, c=32", "/embed/unbatched", 32, "POST", 64), ""),
]


def batch_totals(base: str, function: str) -> tuple[float, float]:
    stats = httpx.get(base + "/stats", timeout=10).json().get(function, {})
    return stats.get("batches", 0.0), stats.get("items", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="")
    parser.add_argument(
        "--uvicorn-access-log",
        action="store_true",
        help="run uvicorn with its default access log (to /dev/null), not --no-access-log",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: run `make bench` (it installs it) or `apt-get install wrk`")
    servers, bases = start_servers(
        "benchmarks.batch_app:fastapi_app",
        "benchmarks.batch_app:app",
        "/stats",
        uvicorns={"uvicorn": args.uvicorn_access_log},
    )
    try:
        with tempfile.TemporaryDirectory() as folder:
            for scenario, function in SCENARIOS:
                if args.only and args.only not in scenario.name:
                    continue
                script = lua_script(scenario, Path(folder))
                runs: dict[str, list[Result]] = {"uvicorn": [], "toolkit": []}
                batches = {"uvicorn": [0.0, 0.0], "toolkit": [0.0, 0.0]}
                for name in runs:
                    run_wrk(bases[name], scenario, script, 3)  # warm up (and load the model)
                for _ in range(args.rounds):
                    for name in runs:
                        before = batch_totals(bases[name], function) if function else (0.0, 0.0)
                        runs[name].append(
                            run_measured(servers[name], bases[name], scenario, script, args.duration)
                        )
                        after = batch_totals(bases[name], function) if function else (0.0, 0.0)
                        batches[name][0] += after[0] - before[0]
                        batches[name][1] += after[1] - before[1]
                bare, ours = median(runs["uvicorn"]), median(runs["toolkit"])

                def mean_batch(name: str, batches: dict[str, list[float]] = batches) -> str:
                    count, items = batches[name]
                    return f"{items / count:5.1f}" if count else "    -"

                print(
                    f"{scenario.name:28} uvicorn {bare.rps:7.0f} req/s p50 {bare.p50_ms:6.2f} p99 "
                    f"{bare.p99_ms:7.2f} ms batch {mean_batch('uvicorn')} | toolkit {ours.rps:7.0f} req/s "
                    f"p50 {ours.p50_ms:6.2f} p99 {ours.p99_ms:7.2f} ms batch {mean_batch('toolkit')} | "
                    f"ratio {ours.rps / bare.rps:4.2f}x, failures {bare.failures}/{ours.failures} | "
                    f"server CPU/request uvicorn {bare.cpu_ms:.3f} ms, toolkit {ours.cpu_ms:.3f} ms",
                    flush=True,
                )
    finally:
        stop_servers(servers)


if __name__ == "__main__":
    main()
