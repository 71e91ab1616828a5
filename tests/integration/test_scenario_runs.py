"""``tests.scenario.run_scenario``: a scenario whose Ray cluster did not start in Ray's
fixed 30 s runs again, up to ``RAY_STARTS`` runs; any other failure fails at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenario import RAY_START_TIMED_OUT, RAY_STARTS, run_scenario

SCENARIO = """
import sys
from pathlib import Path

runs = Path(sys.argv[1])
runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
if len(runs.read_text()) <= int(sys.argv[3]):
    raise Exception(sys.argv[2])
print('{"runs": %d}' % len(runs.read_text()))
"""


def _scenario(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "flaky_scenario.py").write_text(SCENARIO)
    return {"PYTHONPATH": str(tmp_path)}


def test_a_cluster_that_did_not_start_in_rays_time_runs_the_scenario_again(tmp_path: Path) -> None:
    env = _scenario(tmp_path)
    runs = str(tmp_path / "runs")
    failing = str(RAY_STARTS - 1)
    result = run_scenario("flaky_scenario", runs, RAY_START_TIMED_OUT, failing, timeout_s=30, env_extra=env)
    assert result == {"runs": RAY_STARTS}


def test_a_cluster_that_never_starts_in_rays_time_fails_after_its_last_run(tmp_path: Path) -> None:
    env = _scenario(tmp_path)
    runs = tmp_path / "runs"
    with pytest.raises(AssertionError, match="scenario failed"):
        run_scenario("flaky_scenario", str(runs), RAY_START_TIMED_OUT, "99", timeout_s=30, env_extra=env)
    assert runs.read_text() == "x" * RAY_STARTS


def test_another_failure_fails_at_once(tmp_path: Path) -> None:
    env = _scenario(tmp_path)
    runs = tmp_path / "runs"
    with pytest.raises(AssertionError, match="scenario failed"):
        run_scenario("flaky_scenario", str(runs), "its own error", "1", timeout_s=30, env_extra=env)
    assert runs.read_text() == "x"  # run once
