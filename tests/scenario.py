"""Scenarios that need a Ray cluster of their own run in a fresh Python process; each
prints its findings as one JSON line last."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from tests.conftest import ROOT


def run_scenario(
    module: str, *args: str, timeout_s: float, env_extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``python -m module args`` from the repository root (with ``env_extra`` in its
    environment); its last JSON line. The scenario and every process it starts (its Ray
    cluster's) run in a process group of their own: past ``timeout_s`` the whole group is
    killed, not only the scenario's own process."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update(env_extra or {})
    with subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            raise AssertionError(
                f"scenario {module} ran past its {timeout_s} s bound and was killed:\n"
                f"{stdout[-3000:]}\n{stderr[-6000:]}"
            ) from None
        finally:
            _stop_group(process.pid)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert process.returncode == 0 and lines, f"scenario failed:\n{stdout[-3000:]}\n{stderr[-6000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _stop_group(group: int) -> None:
    """Whatever of the scenario's group still runs once it ended (a Ray process that
    outlived its driver) is stopped."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:  # the group is empty: everything ended
        pass
