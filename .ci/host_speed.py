"""A fixed CPU loop, timed: how fast this host runs Python on one core right now.

`.ci/run` prints it beside each job's time, so a slow host is told from a slow suite: the
suite's budgets (CONTRIBUTING.md) were set on a host where this loop took REFERENCE_S.
"""

from __future__ import annotations

import time

#: The loop's best time on the host CONTRIBUTING.md's time table was measured on.
REFERENCE_S = 0.49


def loop() -> float:
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
    best = min(loop() for _ in range(3))
    ratio = REFERENCE_S / best
    print(f"host speed: fixed loop {best:.2f} s, {ratio:.2f}x the reference host ({REFERENCE_S:.2f} s)")


if __name__ == "__main__":
    main()
