"""Scenarios that need a Ray cluster of their own run in a fresh Python process; each
prints its findings as one JSON line last."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

#: How long the pipes of a scenario that was killed are read for what it had printed.
_DRAIN_S = 10.0
#: What Ray raises when its raylet has not registered within Ray's fixed 30 s (the
#: scenario's own cluster starting on a loaded host): the scenario then runs again.
RAY_START_TIMED_OUT = "The current node timed out during startup"
#: How many times a program whose own Ray cluster did not start in Ray's time is started
#: (scenarios here, `app-toolkit run` in test_cli.py). On a 2-core host about 2.4 times
#: slower than the budget's (.ci/host_speed.py's loop 0.6 s), running three test
#: workers, two starts in a row timed out.
RAY_STARTS = 3


def run_scenario(
    module: str, *args: str, timeout_s: float, env_extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``python -m module args`` from the repository root (with ``env_extra`` in its
    environment); its last JSON line. The scenario runs in a session of its own: past
    ``timeout_s``, and once it ended, every process still in that session (its Ray
    cluster's, whatever process group they moved to) is killed. A scenario whose cluster
    did not start in Ray's time (``RAY_START_TIMED_OUT``) runs again, up to
    :data:`RAY_STARTS` runs in all."""
    returncode, stdout, stderr = _run(module, args, timeout_s, env_extra)
    for _ in range(RAY_STARTS - 1):
        if returncode == 0 or RAY_START_TIMED_OUT not in stderr:
            break
        print(f"scenario {module}: its Ray cluster did not start in Ray's 30 s; running it again")
        returncode, stdout, stderr = _run(module, args, timeout_s, env_extra)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert returncode == 0 and lines, f"scenario failed:\n{stdout[-3000:]}\n{stderr[-6000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _run(
    module: str, args: tuple[str, ...], timeout_s: float, env_extra: dict[str, str] | None
) -> tuple[int, str, str]:
    """One run of the scenario: its exit code, stdout and stderr."""
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
            kill_session(process)
            try:
                stdout, stderr = process.communicate(timeout=_DRAIN_S)
            except subprocess.TimeoutExpired:  # a process outside the session holds the pipes
                stdout, stderr = "", "(its output could not be read)"
            raise AssertionError(
                f"scenario {module} ran past its {timeout_s} s bound and was killed:\n"
                f"{stdout[-3000:]}\n{stderr[-6000:]}"
            ) from None
        finally:
            kill_session(process)
    return process.returncode, stdout, stderr


def kill_session(leader: subprocess.Popen[Any]) -> None:
    """Kill ``leader`` (through Popen: not once it was reaped) and every other process of
    its session (a process may leave its group, not its session). The leader's pid, once
    reaped, may be another process's (pid_max is 32,768 on our hosts, and the suite starts
    thousands): one that leads a session of its own has that pid as its session id, and is
    left alone."""
    leader.kill()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == leader.pid:
            continue
        try:
            if os.getsid(int(entry.name)) == leader.pid:
                os.kill(int(entry.name), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # gone meanwhile
            continue
