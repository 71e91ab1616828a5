"""Instructions per request of ``front_cost``'s modes, counted by valgrind (callgrind).

Times on a shared machine move by 10 % from one minute to the next; instruction counts
do not (the same count twice, whatever else runs), so a change of a few percent in what a
request costs shows here when no timing could show it. Each mode runs twice under
callgrind, with ``--small`` and ``--large`` requests per round (plus the half of that
``front_cost`` uses to warm up); the difference, divided by the requests it adds, is
what one request costs: starting Python and importing the app cancel out.

    python -m benchmarks.front_instructions [--modes bare,direct,wire-bare,wire-direct] [--without access-log]

Needs ``valgrind`` (``apt-get install valgrind``); each mode takes about a minute.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import front_cost

ROOT = Path(__file__).resolve().parents[1]


def instructions(mode: str, requests: int, without: str) -> int:
    """What the whole front_cost process executes with ``requests`` per round (one round)."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "benchmarks.front_cost",
        "--modes",
        mode,
        "--requests",
        str(requests),
        "--rounds",
        "1",
        *(["--without", without] if without else []),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", default=",".join(front_cost.MODES))
    parser.add_argument("--without", default="", help="features front_cost drops (see its --without)")
    parser.add_argument("--small", type=int, default=300, help="requests per round, first run")
    parser.add_argument("--large", type=int, default=900, help="requests per round, second run")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed: apt-get install valgrind")
    if args.large <= args.small:
        parser.error("--large must be more than --small")
    added = (args.large - args.small) * 3 // 2  # front_cost warms up with half a round
    label = f" without {args.without}" if args.without else ""
    for mode in (mode for mode in args.modes.split(",") if mode):
        large = instructions(mode, args.large, args.without)
        per_request = (large - instructions(mode, args.small, args.without)) / added
        print(f"{mode + label:40s} {per_request / 1000:8.1f} thousand instructions per request", flush=True)


if __name__ == "__main__":
    main()
