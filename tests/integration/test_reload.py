"""``app-toolkit run --reload`` replaces only what an edit changed: an edit to the ingress
leaves the model's replica running (same process, weights loaded once); an edit to the
model's module replaces it. Both run modes (an import path, a config file), in a real
subprocess."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import plain_http
from tests.conftest import free_port
from tests.integration.test_cli import RunningCLI, running_cli
from tests.waiting import wait_for

INGRESS = """
from fastapi import APIRouter

import app_toolkit as tk
from model import Model

VERSION = {version}
router = APIRouter()


@router.get("/info")
async def info(model: tk.DeploymentHandle = tk.Depends(Model)) -> dict[str, object]:
    return {{"ingress": VERSION, "model": await model.info.remote()}}


app = tk.App(router, name="shop")
"""

#: Each load appends a line to loads.log, and each import of the module one to
#: imports.log (not .py files: the watcher ignores them), so the counts survive the
#: module's re-imports and the replica's process.
MODEL = """
import os
from pathlib import Path

import app_toolkit as tk

VERSION = {version}
LOADS = Path(__file__).with_name("loads.log")
with Path(__file__).with_name("imports.log").open("a") as imports:
    imports.write(f"{{os.getpid()}}\\n")


@tk.deployment
class Model:
    def __init__(self) -> None:  # "loads the weights"
        with LOADS.open("a") as file:
            file.write(f"{{os.getpid()}}\\n")
        self.load = len(LOADS.read_text().splitlines())
        self.pid = os.getpid()

    def info(self) -> dict[str, int]:
        return {{"pid": self.pid, "load": self.load, "version": VERSION}}
"""

RAY_START_S = 120
RELOAD_S = 60


def _lines(path: Path, pid: int | None = None) -> int:
    """How many lines ``path`` has (only those written by ``pid``, if given)."""
    return sum(1 for line in path.read_text().splitlines() if pid is None or line == str(pid))


def _wait_for_reload(cli: RunningCLI, file: str) -> None:
    """Until a change of ``file`` was seen and every redeploy begun since has ended."""
    cli.wait_for_output(f"{file} changed; redeploying", RELOAD_S)

    def settled() -> bool:
        output = cli.output()
        return output.count("app-toolkit: redeployed") == output.count("; redeploying")

    wait_for(settled, RELOAD_S, "the redeploys to end", interval_s=0.1)


#: Both run modes on the local backend; on Ray (a run of its own: ~20 s), the config file,
#: whose versions take the longer way (entries, not import paths). The rule is one function
#: (code_sources) whichever backend runs the replicas.
CASES = [("import-path", "local"), ("config-file", "local"), ("config-file", "ray")]


@pytest.mark.parametrize(("mode", "backend"), CASES, ids=[f"{mode}-{backend}" for mode, backend in CASES])
def test_reload_keeps_the_model_warm_across_ingress_edits(tmp_path: Path, mode: str, backend: str) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "ingress.py").write_text(INGRESS.format(version=1))
    (project / "model.py").write_text(MODEL.format(version=1))
    port = free_port()
    if mode == "config-file":
        config = {
            "http_options": {"host": "127.0.0.1", "port": port},
            "applications": [{"name": "shop", "route_prefix": "/", "import_path": "ingress:app"}],
        }
        (project / "serve.yaml").write_text(yaml.safe_dump(config))
        args = ["serve.yaml"]
    else:
        args = ["ingress:app", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--reload", *(["--local"] if backend == "local" else [])]
    url = f"http://127.0.0.1:{port}/info"

    def info() -> dict[str, Any]:
        reply = plain_http.get(url, timeout=30)
        reply.raise_for_status()
        answer: dict[str, Any] = reply.json()
        return answer

    with running_cli(args, project, tmp_path / "cli.log") as cli:
        cli.wait_for_output("watching", RAY_START_S)
        first = info()
        assert first["ingress"] == 1 and first["model"]["load"] == 1, first
        # The command's own imports (a Ray replica of the ingress imports model.py too: a
        # new one does again).
        imports = _lines(project / "imports.log", cli.process.pid)

        (project / "ingress.py").write_text(INGRESS.format(version=2))
        _wait_for_reload(cli, "ingress.py")
        wait_for(lambda: info()["ingress"] == 2, RELOAD_S, "the new ingress to serve")
        assert info()["model"] == first["model"], "the model was replaced by an ingress edit"
        assert _lines(project / "loads.log") == 1
        assert _lines(project / "imports.log", cli.process.pid) == imports, "model.py was imported anew"

        (project / "model.py").write_text(MODEL.format(version=1))  # saved again, unchanged
        _wait_for_reload(cli, "model.py")
        assert info()["model"] == first["model"], "the model was replaced by a save that changed nothing"

        (project / "model.py").write_text(MODEL.format(version=2))
        wait_for(lambda: info()["model"]["version"] == 2, RELOAD_S, "the new model to serve")
        second = info()["model"]
        assert second["load"] == 2, second
        if backend == "ray":  # a replica of its own, in a process of its own
            assert second["pid"] != first["model"]["pid"]
        assert cli.stop(signal.SIGTERM) == 0, cli.output()[-3000:]
