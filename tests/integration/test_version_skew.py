"""A driver whose Ray differs from its cluster's is refused at once, with both versions
and the fix (docs/compatibility.md): a real head of the lowest Ray in range, started from
the lowest job's venv (``make test-lowest`` makes it; ``.ci/run`` runs that job first),
joined with the newest job's ``app-toolkit run --address``. (The other way round, a
driver older than Ray 2.60's head meets its token authentication before any version
check: Ray's connection error.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import ray

from app_toolkit._runtime.backends.ray import ray_compat
from app_toolkit._runtime.backends.ray.cluster import _skew_fix, _supported_ray
from tests.conftest import ROOT, free_port
from tests.waiting import wait_for

#: The newest job's venv (the driver) and the lowest job's (the head).
DRIVER = ROOT / ".venv" / "bin"
HEAD = ROOT / ".venv-lowest" / "bin"


def _version(bin_dir: Path) -> str:
    done = subprocess.run(
        [str(bin_dir / "python"), "-c", "import ray; print(ray.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout.strip()


def test_rays_refusal_is_read_as_the_versions_it_names() -> None:
    metadata = {"ray_version": "2.0.0", "python_version": "3.9.1"}
    with pytest.raises(RuntimeError) as refused:
        ray._private.utils.check_version_info(metadata, "node 127.0.0.1")
    assert ray_compat.version_skew(refused.value) == ray_compat.VersionSkew(
        "2.0.0", "3.9.1", ray.__version__, ".".join(map(str, sys.version_info[:3]))
    )
    assert ray_compat.version_skew(RuntimeError("something else")) is None


def test_the_fix_it_names_fits_what_differs() -> None:
    older = _skew_fix(ray_compat.VersionSkew("2.52.0", "3.11.7", "2.60.0", "3.11.7"))
    assert older.startswith("Install the cluster's Ray here (pip install 'ray==2.52.0')")
    unsupported = _skew_fix(ray_compat.VersionSkew("2.40.0", "3.11.7", "2.60.0", "3.11.7"))
    supported = _supported_ray()  # as installed: pyproject.toml's range, lower bound first
    assert supported is not None and supported.startswith(">=")
    assert f"supports Ray {supported}, which 2.40.0 is not" in unsupported
    assert "pip install" not in unsupported
    python = _skew_fix(ray_compat.VersionSkew("2.60.0", "3.12.1", "2.60.0", "3.11.7"))
    assert python == "Run this program on Python 3.12.1, the cluster's."


@pytest.mark.skipif(
    not (HEAD / "ray").exists() or not (DRIVER / "app-toolkit").exists(),
    reason="needs the lowest job's venv beside the newest's (make test-lowest makes .venv-lowest)",
)
def test_joining_a_cluster_of_another_ray_fails_at_once_naming_both_versions() -> None:
    """About 10 s: a head of its own (another Ray cannot share the suite's cluster)."""
    theirs, ours = _version(HEAD), _version(DRIVER)
    assert theirs and theirs != ours
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    temp = tempfile.mkdtemp(prefix="skew", dir="/tmp")  # short: Ray's socket paths live in it
    head = subprocess.Popen(
        [
            str(HEAD / "ray"), "start", "--head", "--block", "--port", str(port), "--node-ip-address",
            "127.0.0.1", "--num-cpus", "0", "--include-dashboard", "false", "--temp-dir", temp,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its processes in one group, stopped by its id below
    )  # fmt: skip
    try:
        wait_for(lambda: _listening(port) or head.poll() is not None, 60, "ray start --head")
        assert head.poll() is None
        done = subprocess.run(
            [str(DRIVER / "app-toolkit"), "run", "examples.demo:app", "--address", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=30)
    assert done.returncode == 1, done.stderr
    python = ".".join(map(str, sys.version_info[:3]))
    assert f"runs Ray {theirs} on Python {python}" in done.stderr
    assert f"this process has Ray {ours} on Python {python}" in done.stderr
    assert f"pip install 'ray=={theirs}'" in done.stderr
    assert "Run this program on Python" not in done.stderr  # the same Python: no such advice
    assert "Traceback" not in done.stderr


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
