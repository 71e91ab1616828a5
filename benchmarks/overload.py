"""Overload: three times what the service can serve, for a minute, then quiet.

Starts ``app-toolkit run benchmarks.overload_app:app`` (embedded Ray, one replica, every
option at its default: 100 requests running per replica, 1,000 queued per proxy) and a
route that burns ``--work-ms`` of CPU per request. It measures the capacity (closed loop,
64 clients), then sends 3 x that rate open loop (new requests on schedule, answered or
not) for ``--duration`` seconds, and prints:

- the answers by status (only 200 and 503 + Retry-After are acceptable; 0 = no answer);
- p50/p99 latency of the admitted (200) requests, and of the refusals;
- the resident memory of the proxy and the replica: after warm-up, at the end of the
  overload and after ``--quiet`` seconds of quiet (it should come back down).

    python -m benchmarks.overload [--duration 60] [--factor 3] [--work-ms 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

from benchmarks.http_overhead import BIN, ROOT, free_port, wait_ready
from benchmarks.loadgen import Client, Tally, closed_loop, open_loop
from benchmarks.proc_cpu import rss_mb, toolkit_processes


def report(label: str, tally: Tally, seconds: float) -> None:
    statuses = tally.statuses()
    refused = [o for o in tally.outcomes if o.status == 503]
    answers = dict(sorted(statuses.items()))
    print(f"{label}: {len(tally.outcomes)} requests in {seconds:.0f} s; answers {answers}")
    print(
        f"  admitted (200): {statuses[200] / seconds:.0f}/s, p50 {tally.median_ms(200):.1f} ms, "
        f"p99 {tally.percentile_ms(200, 0.99):.1f} ms"
    )
    if statuses[0]:
        print(f"  no answer: {dict(tally.errors().most_common(5))}")
    if refused:
        with_retry = sum(o.retry_after == "1" for o in refused)
        print(
            f"  refused (503): p50 {tally.median_ms(503):.1f} ms, "
            f"p99 {tally.percentile_ms(503, 0.99):.1f} ms, {with_retry} of {len(refused)} with Retry-After: 1"
        )


def memory(label: str, pids: dict[int, str]) -> None:
    print(f"  RSS {label}: " + ", ".join(f"{name} {mb:.0f} MB" for name, mb in sorted(rss_mb(pids).items())))


async def measure(args: argparse.Namespace, port: int, pids: dict[int, str]) -> bool:
    path = f"/work?ms={args.work_ms}"
    client = Client("127.0.0.1", port)
    warm = await closed_loop(client, path, 64, 5)  # warm-up
    memory("after warm-up", pids)
    started = time.monotonic()
    capacity = await closed_loop(client, path, 64, 8)
    rate = capacity.statuses()[200] / (time.monotonic() - started)
    report("capacity (closed loop, 64 clients)", capacity, 8)
    del warm
    offered = args.factor * rate
    print(f"\noverload: {args.factor:g} x {rate:.0f}/s = {offered:.0f} requests/s for {args.duration} s")
    started = time.monotonic()
    tally = await open_loop(client, path, args.factor * rate, args.duration)
    report("overload (open loop)", tally, time.monotonic() - started)
    memory("at the end of the overload", pids)
    client.close()
    await asyncio.sleep(args.quiet)
    memory(f"after {args.quiet} s of quiet", pids)
    statuses = tally.statuses()
    unacceptable = {status: n for status, n in statuses.items() if status not in (200, 503)}
    missing_retry = sum(o.status == 503 and o.retry_after != "1" for o in tally.outcomes)
    ok = not unacceptable and not missing_retry
    print(
        "PASS: only 200 and 503 + Retry-After"
        if ok
        else f"FAIL: {unacceptable}, {missing_retry} 503s without Retry-After"
    )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=60)
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--work-ms", type=float, default=2.0)
    parser.add_argument("--quiet", type=int, default=30)
    args = parser.parse_args()
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    server = subprocess.Popen(
        [str(BIN / "app-toolkit"), "run", "benchmarks.overload_app:app", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # the access log: a line per request
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/pid", server, timeout_s=180)
        pids = toolkit_processes(server.pid)
        ok = asyncio.run(measure(args, port, pids))
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
