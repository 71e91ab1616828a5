"""Scenarios that need a Ray cluster of their own run in a fresh Python process; each
prints its findings as one JSON line last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.conftest import ROOT


def run_scenario(
    module: str, *args: str, timeout_s: float, env_extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``python -m module args`` from the repository root (with ``env_extra`` in its
    environment); its last JSON line."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update(env_extra or {})
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"scenario failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result
