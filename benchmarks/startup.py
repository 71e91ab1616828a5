"""Start to first 200, and idle memory, of the demo on an embedded Ray, beside bare uvicorn.

For each run: start the server, poll a route every 20 ms until it answers 200 (the time
printed), wait until it is idle, then read every process of its tree from /proc: resident
memory (RSS) and proportional memory (PSS, which splits pages processes share, so the sum
is what the tree really holds).

What part of the start is Ray's: ``ray.init()`` alone (a fresh embedded cluster, as
``app-toolkit run`` makes) is timed in its own process, the same number of times.

    python -m benchmarks.startup [--runs 3] [--target examples.demo:app --path /hello/x]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx

from benchmarks.http_overhead import BIN, ROOT, free_port
from benchmarks.proc_cpu import _rss_mb, pss_mb, started_at, tree

_RAY_INIT = """
import time, ray
started = time.perf_counter()
ray.init(address="local", include_dashboard=False, configure_logging=False)
print(time.perf_counter() - started)
ray.shutdown()
"""


def first_200(
    command: list[str], url: str, env: dict[str, str]
) -> tuple[float, subprocess.Popen[bytes], float]:
    """Seconds from starting ``command`` to a 200 from ``url``, the process, and the Unix
    time it was started."""
    started = time.perf_counter()
    wall = time.time()
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = started + 180
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[0]} exited with {process.returncode} before serving {url}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return time.perf_counter() - started, process, wall
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    process.kill()
    raise RuntimeError(f"{url} did not answer 200 within 180 s")


def _kind(pid: int) -> str:
    """A short name: the Ray actor class, a Ray daemon, or the command."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    first = argv[0].decode(errors="replace")
    if first.startswith("ray::"):
        return first.split(".")[0]  # ray::ProxyActor, ray::ReplicaActor, ray::IDLE
    words = [arg.decode(errors="replace") for arg in argv if arg]
    for word in words:
        for daemon in ("gcs_server", "raylet", "log_monitor", "dashboard", "runtime_env", "monitor.py"):
            if daemon in word:
                return daemon
    return Path(words[1] if len(words) > 1 and "python" in first else first).name


def timeline(root: int, since: float) -> list[tuple[float, str]]:
    """(seconds after ``since``, kind) of each process of the tree, by start time."""
    return sorted((started_at(pid) - since, _kind(pid)) for pid in tree(root))


def memory(root: int) -> dict[str, tuple[int, float, float]]:
    """Per kind of process: (count, RSS MB, PSS MB), summed."""
    found: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for pid in tree(root):
        entry = found[_kind(pid)]
        entry[0] += 1
        entry[1] += _rss_mb(pid)
        entry[2] += pss_mb(pid)
    return {kind: (int(n), rss, pss) for kind, (n, rss, pss) in found.items()}


def _each(seconds: list[float]) -> str:
    return ", ".join(f"{took:.2f}" for took in seconds)


def stop(process: subprocess.Popen[bytes], signum: int) -> None:
    process.send_signal(signum)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--target", default="examples.demo:app", help="what app-toolkit runs")
    parser.add_argument("--path", default="/hello/startup", help="the route polled for its first 200")
    parser.add_argument("--idle-s", type=float, default=5.0, help="wait this long before reading memory")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)

    ray_init = [
        float(
            subprocess.run(
                [sys.executable, "-c", _RAY_INIT], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(args.runs)
    ]
    bare, ours, last_memory, bare_memory = [], [], {}, {}
    for _ in range(args.runs):
        port = free_port()
        took, process, _ = first_200(
            [
                str(BIN / "uvicorn"),
                "benchmarks.bench_app:fastapi_app",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            f"http://127.0.0.1:{port}/small",
            env,
        )
        bare.append(took)
        time.sleep(1.0)
        bare_memory = memory(process.pid)
        stop(process, signal.SIGTERM)
        port = free_port()
        took, process, began = first_200(
            [str(BIN / "app-toolkit"), "run", args.target, "--port", str(port)],
            f"http://127.0.0.1:{port}{args.path}",
            env,
        )
        ours.append(took)
        starts = timeline(process.pid, began)
        time.sleep(args.idle_s)
        last_memory = memory(process.pid)
        stop(process, signal.SIGINT)

    print(f"start to first 200 (median of {args.runs}):")
    print(f"  bare uvicorn (bench app)      {statistics.median(bare):5.2f} s")
    print(f"  app-toolkit run {args.target:14}{statistics.median(ours):5.2f} s  (all: {_each(ours)})")
    print(f"  of which ray.init() alone     {statistics.median(ray_init):5.2f} s  (all: {_each(ray_init)})")
    print(f"  the toolkit's own part        {statistics.median(ours) - statistics.median(ray_init):5.2f} s")
    print(
        "  processes started, seconds after the command (last run): "
        + ", ".join(f"{kind} {offset:.2f}" for offset, kind in starts)
        + f"; first 200 at {ours[-1]:.2f}"
    )
    bare_rss = sum(rss for _, rss, _ in bare_memory.values())
    bare_pss = sum(pss for _, _, pss in bare_memory.values())
    print(f"idle memory of bare uvicorn: RSS {bare_rss:.0f} MB, PSS {bare_pss:.0f} MB")
    print(f"idle memory of {args.target}, {args.idle_s:.0f} s after its first 200 (last run):")
    rows = sorted(last_memory.items(), key=lambda item: -item[1][2])
    for kind, (count, rss, pss) in rows:
        print(f"  {kind:28} x{count:<2} RSS {rss:7.0f} MB  PSS {pss:7.0f} MB")
    print(
        f"  {'total':28}     RSS {sum(r for _, r, _ in last_memory.values()):7.0f} MB  "
        f"PSS {sum(p for _, _, p in last_memory.values()):7.0f} MB"
    )


if __name__ == "__main__":
    main()
