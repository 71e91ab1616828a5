"""The app-toolkit command, in a real subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click.testing
import httpx
import pytest
import ray
import yaml
from click.testing import CliRunner

from app_toolkit.cli import main
from app_toolkit.config.api_keys import key_hash, new_key
from tests import plain_http
from tests.apps import basic, gated
from tests.conftest import ROOT, Toolkit, free_port
from tests.scenario import RAY_START_TIMED_OUT, RAY_STARTS
from tests.waiting import wait_for

CLI = [sys.executable, "-m", "app_toolkit.cli"]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``app-toolkit ARGS`` from the repository root, its output captured."""
    return subprocess.run(
        [*CLI, *args], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=timeout
    )


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return env


class RunningCLI:
    """An `app-toolkit run` subprocess (or ``command``) whose output goes to a file the test
    can read.

    It leads a session of its own, so every process it starts (Ray's too) can be found by
    that session's id: see :meth:`processes`. ``sigint_ignored`` starts it as a shell
    starts a background job, with SIGINT ignored.
    """

    def __init__(
        self,
        args: list[str],
        cwd: Path,
        log_path: Path,
        env: dict[str, str] | None = None,
        sigint_ignored: bool = False,
        command: list[str] | None = None,
    ) -> None:
        self._log = log_path.open("w+")
        # `exec` keeps the ignored disposition, as a background job's command inherits it.
        shell = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"] if sigint_ignored else []
        self._command = [*shell, *(command or [*CLI, "run", *args])]
        self._cwd, self._env = cwd, {**cli_env(), **(env or {})}
        self.process = self._launch()
        self._starts = 1
        self._from = 0  # where output() reads from

    def _launch(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self._command,
            cwd=self._cwd,
            env=self._env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def processes(self) -> list[int]:
        """The live processes of its session: itself and what it started (Linux)."""
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except (FileNotFoundError, ProcessLookupError):
                continue  # it has just ended
            # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses.
            state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
            if int(session) == self.process.pid and state != "Z":
                found.append(int(entry))
        return found

    def output(self) -> str:
        """What the command printed (after a start again, what its last run printed)."""
        self._log.seek(self._from)
        return self._log.read()

    def wait_for_output(self, text: str, timeout_s: float, count: int = 1) -> None:
        """Until ``text`` was printed ``count`` times (fails early if the command exited)."""
        printed = self.wait_until(
            lambda: self.output().count(text) >= count, timeout_s, f"the CLI to print {text!r}"
        )
        assert printed, self.output()

    def wait_until(
        self, done: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.2
    ) -> bool:
        """Until ``done()`` (True) or the command exited (False).

        A command whose embedded Ray did not start because its raylet took longer than the
        30 s Ray allows to register (hard-coded in ``ray._private.node``; seen on a
        2-core host running three test workers) is started again, up to ``RAY_STARTS``
        times in all, the earlier attempt's processes stopped and its output no longer
        read (its traceback is the host's load, not the command's doing).
        """

        def state() -> str | None:
            return "done" if done() else "exited" if self.process.poll() is not None else None

        came = wait_for(state, timeout_s, what, interval_s=interval_s)
        if came == "exited" and RAY_START_TIMED_OUT in self.output() and self._starts < RAY_STARTS:
            self._starts += 1
            self._stop_session()
            self._log.seek(0, os.SEEK_END)
            self._log.write("\n--- started again: Ray's node start timed out (test_cli.py) ---\n")
            self._log.flush()
            self._from = self._log.tell()
            self.process = self._launch()
            return self.wait_until(done, timeout_s, what, interval_s)
        return came == "done"

    def stop(self, sig: int) -> int:
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            # A command that registered faulthandler for SIGUSR1 writes where its threads are.
            self.process.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            name = signal.Signals(sig).name
            raise AssertionError(f"not stopped 120 s after {name}:\n{self.output()[-30000:]}") from None

    def close(self) -> None:
        self._stop_session()
        self._log.close()

    def _stop_session(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        # What a command killed (or a failed test) left behind; its own pid, reaped, may be
        # another session's leader now (tests/scenario.py, kill_session).
        for pid in set(self.processes()) - {self.process.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def running_cli(args: list[str], cwd: Path, log_path: Path, **options: Any) -> Iterator[RunningCLI]:
    cli = RunningCLI(args, cwd, log_path, **options)
    try:
        yield cli
    finally:
        cli.close()


def test_a_command_whose_ray_start_timed_out_is_started_again(tmp_path: Path) -> None:
    """The runs but the last fail as ``ray.init`` does when the raylet registers too late;
    the last serves: the test reads only its output."""
    runs = tmp_path / "runs"
    script = (
        "import pathlib, sys, time\n"
        f"runs = pathlib.Path({str(runs)!r})\n"
        "runs.write_text(runs.read_text() + 'x' if runs.exists() else 'x')\n"
        f"if len(runs.read_text()) < {RAY_STARTS}:\n"
        f"    sys.exit('Traceback (most recent call last):\\nException: {RAY_START_TIMED_OUT}.')\n"
        "print('serving', flush=True)\n"
        "time.sleep(60)\n"
    )
    with running_cli([], ROOT, tmp_path / "cli.log", command=[sys.executable, "-c", script]) as cli:
        assert cli.wait_until(lambda: "serving" in cli.output(), 30, "the last run serving")
        assert "Traceback" not in cli.output() and runs.read_text() == "x" * RAY_STARTS
        assert RAY_START_TIMED_OUT in (tmp_path / "cli.log").read_text()  # the earlier runs', kept


def test_run_serves_the_demo_and_stops_cleanly(tmp_path: Path) -> None:
    """On the local backend, stopped by SIGTERM once it serves; on Ray, the demo is stopped
    by Ctrl-C the moment it first answers (the next test: one Ray start for both)."""
    port = free_port()
    stop = signal.SIGTERM
    args = ["examples.demo:app", "--port", str(port), "--local"]
    with running_cli(args, ROOT, tmp_path / "cli.log") as cli:
        cli.wait_for_output("serving examples.demo:app at", 120)
        assert f"at http://127.0.0.1:{port}/" in cli.output()
        response = plain_http.get(f"http://127.0.0.1:{port}/hello/cli", timeout=30)
        assert response.json() == {"message": "Hello, cli!"}
        assert cli.stop(stop) == 0
        assert "shutting down" in cli.output()


def _demo_answers(url: str) -> bool:
    try:
        response = plain_http.get(url, timeout=30)
        return response.status_code == 200 and response.json() == {"message": "Hello, cli!"}
    except httpx.TransportError:
        return False  # not listening yet


def _assert_stopped_cleanly(cli: RunningCLI, stop: int, started: int, while_starting: bool | None) -> None:
    """``stop`` was sent: the command exits 0, says so in a line (``while_starting``:
    what that line says about it; None: either), prints no traceback, and leaves no
    process behind (it had ``started`` processes)."""
    assert cli.process.wait(timeout=60) == 0, cli.output()  # stopping is bounded
    output = cli.output()
    lines = [
        f"app-toolkit: {signal.Signals(stop).name} received{when}; shutting down"
        for when, starting in ((" while starting", True), ("", False))
        if while_starting in (None, starting)
    ]
    assert any(line in output.splitlines() for line in lines), output
    assert output.rstrip().endswith("app-toolkit: stopped"), output
    assert "Traceback" not in output and "Aborted" not in output, output
    # Ray's crash handler did not take the signal (it reports "*** SIGTERM received at
    # time=...", then aborts the process 3 s later, whether the shutdown is done or not).
    assert "received at time=" not in output, output
    # Ray's processes end with the command (its shutdown at exit): the deadline only
    # keeps a failing test from hanging.
    wait_for(lambda: not cli.processes(), 30, f"the {started} processes of the command to end")


@pytest.mark.parametrize("extra", [[], ["--local"]], ids=["ray", "local"])
def test_one_sigint_stops_run_the_moment_it_first_answers(tmp_path: Path, extra: list[str]) -> None:
    """One SIGINT sent the moment the app first answers stops the command. It answers
    about a second before it prints "serving"; it used to install its signal handlers
    only then, and started as a background job (here, with SIGINT ignored) it ignored
    that SIGINT. The app is the demo `make run` serves. About 8 s on Ray: an `app-toolkit
    run` of its own."""
    port = free_port()
    args = ["examples.demo:app", "--port", str(port), *extra]
    with running_cli(args, ROOT, tmp_path / "cli.log", sigint_ignored=True) as cli:
        url = f"http://127.0.0.1:{port}/hello/cli"
        assert cli.wait_until(lambda: _demo_answers(url), 120, "the first answer", 0.02), cli.output()
        started = len(cli.processes())  # a /proc scan: milliseconds
        cli.process.send_signal(signal.SIGINT)
        if not extra:
            assert started >= 3, cli.output()  # with Ray's GCS, raylet, replicas...
        # Whether it had printed "serving" when the signal came is a matter of a moment.
        _assert_stopped_cleanly(cli, signal.SIGINT, started, while_starting=None)


@pytest.mark.parametrize(
    ("stage", "stop"),
    [("import", signal.SIGINT), ("import", signal.SIGTERM), ("constructor", signal.SIGTERM)],
    ids=["importing-the-app-sigint", "importing-the-app-sigterm", "deploying-sigterm"],
)
def test_one_signal_stops_run_while_it_starts(tmp_path: Path, stage: str, stop: int) -> None:
    """A signal while the command imports the app (before Ray starts), or while the
    deployment's constructor runs (a model loading: the deploy waits). Deploying takes
    about 8 s: an `app-toolkit run` of its own, on Ray."""
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {gated.GATE_DIR_ENV: str(gate), gated.GATE_STAGE_ENV: stage}
    args = ["tests.apps.gated:app", "--port", str(free_port())]
    with running_cli(args, ROOT, tmp_path / "cli.log", env=env) as cli:
        reached = gate / f"{stage}.reached"
        assert cli.wait_until(reached.exists, 120, f"the {stage} gate"), cli.output()
        started = len(cli.processes())
        if stage == "constructor":
            assert started >= 3, cli.output()  # Ray's GCS, raylet, the replica...
        cli.process.send_signal(stop)
        _assert_stopped_cleanly(cli, stop, started, while_starting=True)
        assert "serving" not in cli.output()


def test_bad_import_paths_fail_with_a_fix() -> None:
    bad = run_cli("run", "examples.demo")
    assert bad.returncode == 1
    # A module, not what is in it (a dotted path is split at its last dot, as Ray does).
    assert '"examples.demo" is a module: name what in it to import, e.g. "examples.demo:app"' in bad.stderr
    missing = run_cli("run", "examples.demo:Greeter")
    assert missing.returncode == 1
    assert "is a deployment; point at an application such as Greeter.bind()" in missing.stderr
    # Both before a cluster was started for nothing (Ray says so when it starts one).
    assert "Ray cluster" not in bad.stderr + missing.stderr


def test_run_passes_key_value_arguments_to_the_chat_templates_builder(tmp_path: Path) -> None:
    """``app-toolkit run chat.app:build_app backend=echo`` serves the echo model though the
    environment says openai; a key the settings lack is refused before anything starts."""
    chat = ROOT / "examples" / "chat"
    environment = {**cli_env(), "CHAT_BACKEND": "openai"}
    typo = [*CLI, "run", "chat.app:build_app", "bakend=echo", "--local"]
    refused = subprocess.run(typo, cwd=chat, env=environment, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "takes no argument 'bakend': did you mean 'backend'?" in refused.stderr
    port = free_port()
    args = ["chat.app:build_app", "backend=echo", "--local", "--port", str(port)]
    with running_cli(args, chat, tmp_path / "cli.log", env={"CHAT_BACKEND": "openai"}) as cli:
        cli.wait_for_output("serving chat.app:build_app at", 120)
        models = plain_http.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()
        assert [model["id"] for model in models["data"]] == ["echo"]  # openai's would be "default"
        assert cli.stop(signal.SIGTERM) == 0


def test_status_reports_the_running_apps(ray_toolkit: Toolkit) -> None:
    name = ray_toolkit.name()
    ray_toolkit.run(basic.make_app(), name=name, route_prefix="/cli-status")
    address = ray.get_runtime_context().gcs_address
    result = run_cli("status", "--address", address, "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    app = data["applications"][name]
    assert app["status"] == "RUNNING" and app["route_prefix"] == "/cli-status"
    assert app["deployments"]["Ingress"]["replica_states"] == {"RUNNING": 1}

    table = run_cli("status", "--address", address, timeout=120)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert f"{name}  RUNNING  /cli-status" in lines
    ingress = next(line.split() for line in lines if line.split()[:1] == ["Ingress"])
    assert ingress[:5] == ["Ingress", "HEALTHY", "1/1", "1", "RUNNING"]
    assert any(line.startswith("proxy http://127.0.0.1:") for line in lines)


def test_traffic_command_splits_an_app_and_says_what_is_wrong(ray_toolkit: Toolkit) -> None:
    main_app, canary = ray_toolkit.name(), ray_toolkit.name()
    ray_toolkit.run(basic.make_versioned_app("one"), name=main_app, route_prefix="/cli-traffic")
    ray_toolkit.run(basic.make_versioned_app("two"), name=canary, route_prefix=None)
    address = ray.get_runtime_context().gcs_address
    # From another process, as an operator runs it ...
    result = run_cli("traffic", main_app, f"{main_app}=75", f"{canary}=25", "--address", address, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"traffic of {main_app}: {main_app} 75.0%, {canary} 25.0%" in result.stdout

    # ... and the rest in this process (joined to the same cluster): the same commands,
    # without a second or two of starting Python and joining Ray for each.
    def cli(*args: str) -> click.testing.Result:
        return CliRunner().invoke(main, [*args, "--address", address])

    assert f"  traffic: {main_app} 75%, {canary} 25%" in cli("status").stdout.splitlines()
    bad = cli("traffic", main_app, f"{canary}=lots")
    assert bad.exit_code == 1 and "is not NAME=WEIGHT" in bad.stderr
    unknown = cli("traffic", main_app, "nobody=5")
    assert unknown.exit_code == 1 and "no such application" in unknown.stderr
    started = cli("rollout", main_app, "--to", canary, "--steps", "5,100", "--interval", "600")
    assert started.exit_code == 0, started.stderr
    table = cli("status").stdout.splitlines()
    assert f"  rollout to {canary} [5/100 %]: RUNNING at step 1 of 2 (5 %)" in table
    assert f"  traffic: {main_app} 95%, {canary} 5%" in table
    bad_steps = cli("rollout", main_app, "--to", canary, "--steps", "50,10")
    assert bad_steps.exit_code == 1 and "increasing percentages" in bad_steps.stderr
    shadowed = cli("shadow", main_app, "--to", canary, "--fraction", "0.5")
    assert shadowed.exit_code == 0, shadowed.stderr
    lines = cli("status").stdout.splitlines()
    assert any(line.startswith(f"  shadow {canary} (50%): ") for line in lines), lines
    assert cli("shadow", main_app, "--off").exit_code == 0
    assert not any("shadow" in line for line in cli("status").stdout.splitlines())


def test_shutdown_command_stops_the_toolkit_on_the_cluster(ray_toolkit: Toolkit) -> None:
    from app_toolkit._runtime.backends.base import current_session, set_current_session
    from app_toolkit._runtime.backends.ray.cluster import NAMESPACE

    ray_toolkit.run(basic.make_app(), route_prefix="/cli-shutdown")
    ray_toolkit._apps.clear()  # the command below removes it
    address = ray.get_runtime_context().gcs_address
    result = run_cli("shutdown", "--address", address, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "app_toolkit stopped" in result.stdout
    assert [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE] == []
    again = run_cli("shutdown", "--address", address, timeout=180)
    assert again.returncode == 0 and "nothing to stop" in again.stdout
    # This process's session pointed at the stopped controller: drop it.
    session = current_session(create=False)
    if session is not None:
        session.data_plane.close()
    set_current_session(None)


def test_build_then_run_the_file_in_process(tmp_path: Path) -> None:
    built = run_cli(
        "build", "tests.apps.config_apps:hello", "examples.demo:app", "-o", str(tmp_path / "serve.yaml")
    )
    assert built.returncode == 0, built.stderr
    config = yaml.safe_load((tmp_path / "serve.yaml").read_text())
    assert [(a["name"], a["route_prefix"]) for a in config["applications"]] == [
        ("hello", "/"),
        ("demo", "/demo"),
    ]
    port = free_port()
    config["http_options"]["port"] = port
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    with running_cli([str(tmp_path / "serve.yaml"), "--local"], ROOT, tmp_path / "cli.log") as cli:
        cli.wait_for_output("app-toolkit: serving", 60, count=2)
        assert plain_http.get(f"http://127.0.0.1:{port}/hello", timeout=30).json() == "hello"
        greeting = plain_http.get(f"http://127.0.0.1:{port}/demo/hello/file", timeout=30).json()
        assert greeting == {"message": "Hello, file!"}
        assert cli.stop(signal.SIGTERM) == 0


def test_a_config_file_splits_traffic_and_refuses_an_unknown_variant(tmp_path: Path) -> None:
    port = free_port()
    config: dict[str, Any] = {
        "http_options": {"port": port},
        "applications": [
            {"name": "blue", "route_prefix": "/color", "import_path": "tests.apps.config_apps:blue"},
            {"name": "green", "route_prefix": None, "import_path": "tests.apps.config_apps:green"},
        ],
    }
    config["applications"][0]["traffic"] = {"blue": 0, "green": 100}
    config["applications"][0]["shadow"] = {"to": "green", "fraction": 1.0}
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    with running_cli([str(tmp_path / "serve.yaml"), "--local"], ROOT, tmp_path / "cli.log") as cli:
        cli.wait_for_output("app-toolkit: serving", 60, count=2)
        answers = {
            plain_http.get(f"http://127.0.0.1:{port}/color/which", timeout=30).json() for _ in range(20)
        }
        assert answers == {"green"}
        assert cli.stop(signal.SIGTERM) == 0
    config["applications"][0]["traffic"] = {"blue": 50, "purple": 50}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    bad = run_cli("run", str(tmp_path / "bad.yaml"), "--local")
    assert bad.returncode == 1 and "'purple', which is not an application of this file" in bad.stderr


RELOADED_APP = """
from fastapi import APIRouter, Request

import app_toolkit as tk


def build(args: dict[str, str]) -> tk.App:
    router = APIRouter()

    @router.get("/where")
    def where(request: Request) -> dict[str, object]:
        assert request.client is not None
        return {
            "version": VERSION,
            "place": args["place"],
            "root_path": request.scope["root_path"],
            "url": str(request.url_for("where")),
            "client": request.client.host,
        }

    return tk.App(router, name="reloadme")
"""


def test_run_flags_root_path_forwarded_headers_and_reload(tmp_path: Path) -> None:
    """A builder's KEY=VALUE arguments reach it again on each reload."""
    (tmp_path / "reloadme.py").write_text("VERSION = 1\n" + RELOADED_APP)
    port = free_port()
    args = [
        "reloadme:build", "place=here", "--local", "--port", str(port), "--root-path", "/api",
        "--forwarded-allow-ips", "127.0.0.1", "--log-level", "debug", "--reload",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}/where"
    with running_cli(args, tmp_path, tmp_path / "cli.log") as cli:
        cli.wait_for_output("watching", 60)
        assert f"serving reloadme:build at http://127.0.0.1:{port}/api/" in cli.output()
        # Behind a reverse proxy that strips /api and says who the client was:
        forwarded = {"X-Forwarded-For": "10.1.2.3", "X-Forwarded-Proto": "https"}
        first = plain_http.get(url, headers=forwarded, timeout=30).json()
        assert first == {
            "version": 1,
            "place": "here",
            "root_path": "/api",
            "url": f"https://127.0.0.1:{port}/api/where",
            "client": "10.1.2.3",
        }
        (tmp_path / "reloadme.py").write_text("VERSION = 2\n" + RELOADED_APP)
        wait_for(lambda: plain_http.get(url, timeout=30).json()["version"] == 2, 60, "the redeploy")
        assert plain_http.get(url, timeout=30).json()["place"] == "here"
        assert "reloadme.py changed; redeploying" in cli.output()
        (tmp_path / "reloadme.py").write_text("VERSION = (\n")  # a syntax error: keep serving
        cli.wait_for_output("redeploy failed", 60)
        assert plain_http.get(url, timeout=30).json()["version"] == 2
        assert cli.stop(signal.SIGTERM) == 0


def test_version_flag() -> None:
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.startswith("app-toolkit, version ")


def test_reload_redeploys_a_config_files_apps_after_a_code_change(tmp_path: Path) -> None:
    (tmp_path / "reloadme.py").write_text("VERSION = 1\n" + RELOADED_APP)
    port = free_port()
    config = {
        "http_options": {"port": port},
        "applications": [
            {"name": "r", "route_prefix": "/", "import_path": "reloadme:build", "args": {"place": "here"}}
        ],
    }
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}/where"
    with running_cli(["serve.yaml", "--local", "--reload"], tmp_path, tmp_path / "cli.log") as cli:
        cli.wait_for_output("watching", 60)
        assert plain_http.get(url, timeout=30).json()["version"] == 1
        (tmp_path / "reloadme.py").write_text("VERSION = 2\n" + RELOADED_APP)
        wait_for(lambda: plain_http.get(url, timeout=30).json()["version"] == 2, 60, "the redeploy")
        assert plain_http.get(url, timeout=30).json()["place"] == "here"
        assert cli.stop(signal.SIGTERM) == 0


#: The demo served by the Python API from a script, as a user's own program serves it,
#: waiting as tk.run(blocking=True) does. It takes Ctrl-C's default back first: started
#: from a background job (a CI runner's, say), it inherits SIGINT ignored, and Python
#: leaves it so (the CLI installs its own handlers for the same reason).
_SCRIPT = """
import faulthandler, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it is, if it does not stop
import app_toolkit as tk
from examples.demo import app
tk.start(http_options={"port": int(sys.argv[1])}, backend="ray")
tk.run(app)
print("serving examples.demo:app at", flush=True)
try:
    while True:
        time.sleep(0.2)
except KeyboardInterrupt:
    tk.shutdown()
"""


@pytest.mark.parametrize("extra", [["--local"], [], ["python"]], ids=["local", "ray", "tk.run"])
def test_json_logs_from_every_process_carry_the_request_id(tmp_path: Path, extra: list[str]) -> None:
    port = free_port()
    args = ["examples.demo:app", "--port", str(port), "--log-format", "json", "--log-level", "info", *extra]
    script = [sys.executable, "-c", _SCRIPT, str(port)] if extra == ["python"] else None
    env = {"APP_TOOLKIT_LOG_FORMAT": "json", "APP_TOOLKIT_LOG_LEVEL": "INFO"}
    # app-toolkit run takes API keys from the environment too: the request needs one, on Ray
    # where the proxy hands the connection to the ingress replica, and no log line of any
    # process shows it, its hash or its header.
    key, sent = new_key(), dict[str, str]()
    if script is None:
        keys_file = tmp_path / "keys.yaml"
        keys_file.write_text(f"- {{name: logs, hash: '{key_hash(key)}'}}\n")
        env["APP_TOOLKIT_API_KEYS_FILE"] = str(keys_file)
        sent = {"authorization": f"Bearer {key}"}
    with running_cli(args, ROOT, tmp_path / "cli.log", env=env, command=script) as cli:
        cli.wait_for_output("serving examples.demo:app at", 120)
        url = f"http://127.0.0.1:{port}/hello/logs"
        if sent:
            refused = plain_http.get(url, headers={"authorization": f"Bearer {key}x"}, timeout=30)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        response = plain_http.get(url, headers=sent, timeout=30)
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]

        def access_line() -> dict[str, Any] | None:
            for entry in _json_lines(cli.output()):
                if entry.get("logger") == "app_toolkit.access" and entry.get("request_id") == request_id:
                    return entry
            return None

        entry = wait_for(access_line, 30, "the access line of the request")
        assert entry["level"] == "INFO" and entry["timestamp"].endswith("Z")
        assert entry["route"] == "/hello/{name}" and "GET /hello/logs" in entry["message"]
        if extra != ["--local"]:
            # The access line came the short way (the console pipe) whichever started the
            # Ray, not Ray's relay, which would prefix it with "(ProxyActor pid=N) ".
            line = next(
                line
                for line in cli.output().splitlines()
                if request_id in line and '"app_toolkit.access"' in line
            )
            assert line.startswith("{"), line
        assert cli.stop(signal.SIGINT) == 0
        for secret in (key, key_hash(key)[7:]):
            assert secret not in cli.output()


def _json_lines(output: str) -> list[dict[str, Any]]:
    """JSON log records, also those Ray forwards from workers as "(Actor pid=N) {...}"."""
    found = []
    for line in output.splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            entry = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(entry, dict) and "logger" in entry:
            found.append(entry)
    return found
