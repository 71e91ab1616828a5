"""The toolkit started, used and stopped from different threads of one process (#17 e)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT, free_port


def test_started_from_a_thread_that_ends_it_keeps_serving_and_stops_cleanly() -> None:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.thread_scenario", str(free_port())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"scenario failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    seen = json.loads(lines[-1])
    # status() with nothing running answers empty and starts nothing (Ray Serve does the same).
    assert seen["status_before"] == {"applications": {}, "proxies": {}}
    assert seen["ray_started_by_status"] is False
    assert seen["http"] == 200
    assert seen["apps"] == ["threads"]
    assert seen["shutdown_s"] < 30
