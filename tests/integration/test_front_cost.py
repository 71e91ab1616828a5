"""benchmarks/front_cost.py (docs/benchmarks.md quotes it) still runs every mode."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_front_cost_benchmark_measures_every_mode_and_feature_switch() -> None:
    # Its own process: --without replaces toolkit functions, and it logs to /dev/null.
    command = [sys.executable, "-m", "benchmarks.front_cost", "--rounds", "1", "--requests", "40"]
    done = subprocess.run(
        [*command, "--without", "trace,scope,metrics,access-log"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    modes = ["bare", "replica", "direct", "direct-keys", "floor", "wire-bare", "wire-direct"]
    assert [line.split()[0] for line in lines] == modes
    for line in lines:
        found = re.search(r"([\d.]+) us per request", line)
        assert found is not None and float(found.group(1)) > 0, line
    refused = subprocess.run(
        [*command, "--modes", "fast"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2 and "unknown mode or feature: fast" in refused.stderr
