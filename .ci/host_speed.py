"""A fixed CPU loop, timed: how fast this host runs Python right now, on one core and on
two at once.

`.ci/run` prints it before and after the jobs, so a slow host is told from a slow suite:
CONTRIBUTING.md's time table says what the loop took on the host it was measured on. The
two-at-once figure tells two real cores (about the one-core time) from two threads of one
core or a host that is busy elsewhere (up to twice it).
"""

from __future__ import annotations

import multiprocessing
import time


def loop(_: int = 0) -> float:
    """One pass of a fixed workload (integer arithmetic, calls, a dict), in seconds."""
    started = time.perf_counter()
    table: dict[int, int] = {}
    total = 0
    for i in range(3_000_000):
        total = (total + i * i) % 1_000_003
        table[i & 1023] = total
    assert len(table) == 1024
    return time.perf_counter() - started


def main() -> None:
    alone = min(loop() for _ in range(3))
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        paired = min(max(pool.map(loop, range(2))) for _ in range(2))
    print(f"host speed: fixed loop {alone:.2f} s on one core, {paired:.2f} s on two at once")


if __name__ == "__main__":
    main()
