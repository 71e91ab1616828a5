"""Config files: `app-toolkit deploy` to a cluster started with `ray start --head`, as
docs/deploy.md says, then updates, a failing update, validation and `config`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import plain_http
from tests.conftest import ROOT, free_port
from tests.scenario import kill_session
from tests.waiting import wait_for

CLI = [sys.executable, "-m", "app_toolkit.cli"]
RAY = str(Path(sys.executable).parent / "ray")


class Head:
    def __init__(self, address: str, port: int) -> None:
        self.address = address
        self.url = f"http://127.0.0.1:{port}"
        self.port = port

    def cli(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args, "--address", self.address],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


#: The cluster's token (Ray's token authentication, as a production cluster has it): the
#: head and every command that joins it by address get it from the environment.
TOKEN = uuid.uuid4().hex


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)
    env["PYTHONPATH"] = str(ROOT)  # the cluster's workers import tests.apps.* from here
    return env


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    """A Ray head node of its own, started the way the docs say (`ray start --head`)."""
    gcs_port = free_port()
    log = (tmp_path_factory.mktemp("head") / "ray.log").open("w")
    process = subprocess.Popen(
        [
            RAY, "start", "--head", "--block", "--port", str(gcs_port), "--node-ip-address", "127.0.0.1",
            "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats",
        ],
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped by that group's id below
    )  # fmt: skip
    head = Head(f"127.0.0.1:{gcs_port}", free_port())
    try:
        # The GCS listening first (a CLI that joins costs a second or two of a core), then
        # a CLI that joins it.
        wait_for(lambda: _listening(gcs_port) or process.poll() is not None, 60, "the GCS listening")
        wait_for(lambda: head.cli("status").returncode in (0, 1) and process.poll() is None, 60, "ray start")
        yield head
    finally:
        # `ray start --block` takes half a minute to stop gracefully, and SIGTERM left it
        # running past 5 s. This throwaway head's processes are all in its session: its GCS
        # and raylet in its group, the workers (the toolkit's controller, proxy and
        # replicas among them) each in a group of its own. They go at once.
        kill_session(process)
        process.wait(timeout=30)
        log.close()


def _write(path: Path, head: Head, apps: list[dict[str, Any]], **top: Any) -> Path:
    config = {"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": head.port}, **top}
    path.write_text(yaml.safe_dump({**config, "applications": apps}, sort_keys=False))
    return path


GREET = {
    "name": "greet",
    "route_prefix": "/",
    "import_path": "tests.apps.config_apps:build",
    "args": {"greeting": "Hi"},
    "deployments": [{"name": "Greeter", "user_config": {"punctuation": "?"}}],
}
HELLO = {"name": "hello", "route_prefix": "/h", "import_path": "tests.apps.config_apps:hello"}


def test_deploy_update_fail_and_show_config(head: Head, tmp_path: Path) -> None:
    first = _write(tmp_path / "serve.yaml", head, [GREET, HELLO])
    done = head.cli("deploy", str(first), "--wait")
    assert done.returncode == 0, done.stderr
    # The CLI has exited; the controller, proxy and replicas outlive it.
    greeted = plain_http.get(f"{head.url}/greet/ann", timeout=30).json()
    assert greeted["text"] == "Hi, ann?"
    assert plain_http.get(f"{head.url}/h/hello", timeout=30).json() == "hello"

    shown = head.cli("config")
    assert shown.returncode == 0 and yaml.safe_load(shown.stdout) == yaml.safe_load(first.read_text())

    # A light option (user_config) changes in place; an app left out of the file goes away.
    light = dict(GREET, deployments=[{"name": "Greeter", "user_config": {"punctuation": "!!"}}])
    second = _write(tmp_path / "serve2.yaml", head, [light])
    done = head.cli("deploy", str(second), "--wait")
    assert done.returncode == 0, done.stderr
    again = plain_http.get(f"{head.url}/greet/ann", timeout=30).json()
    assert again == {"text": "Hi, ann!!", "replica": greeted["replica"]}  # same replica
    wait_for(
        lambda: plain_http.get(f"{head.url}/h/hello", timeout=30).status_code == 404, 30, "hello removed"
    )

    # An update whose replicas cannot start: --wait fails with the app's message and the
    # previous version keeps serving.
    broken = dict(light, args={"greeting": "Yo", "fail": True})
    done = head.cli(
        "deploy", _write(tmp_path / "serve3.yaml", head, [broken]).as_posix(), "--wait", "--timeout", "120"
    )
    assert done.returncode == 1
    assert "the greeter was told to fail" in done.stderr
    assert plain_http.get(f"{head.url}/greet/bob", timeout=30).json()["text"] == "Hi, bob!!"

    # Invalid files change nothing and say where the problem is.
    bad = dict(light, deployments=[{"name": "Greeter", "num_replicas": "many", "color": "red"}])
    done = head.cli("deploy", _write(tmp_path / "bad.yaml", head, [bad]).as_posix())
    assert done.returncode == 1
    assert "applications[0] (greet).deployments[0] (Greeter).num_replicas" in done.stderr
    assert "applications[0] (greet).deployments[0] (Greeter).color: unknown field" in done.stderr
    missing = dict(light, import_path="tests.apps.no_such_module:app")
    done = head.cli("deploy", _write(tmp_path / "missing.yaml", head, [missing]).as_posix())
    assert done.returncode == 1
    assert "missing.yaml" in done.stderr and "applications[0] (greet)" in done.stderr
    assert 'import_path: Could not import module "tests.apps.no_such_module"' in done.stderr
    assert plain_http.get(f"{head.url}/greet/bob", timeout=30).json()["text"] == "Hi, bob!!"
