"""The three servers a case goes to: uvicorn ``--http httptools`` serving the echo app
(the parser the toolkit's front builds on), and the toolkit serving it on direct ingress
and on the proxied path. Each case goes to all three at once."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

import app_toolkit as tk
from tests import plain_http
from tests.deployments import as_deployment
from tests.fuzz.echo_app import PROXIED_PREFIX, DirectEcho, ProxiedEcho
from tests.fuzz.grammar import Case
from tests.fuzz.wire import QUIET_S, Outcome, exchange
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Outcomes:
    uvicorn: Outcome
    toolkit: Outcome


@dataclass
class Servers:
    uvicorn_port: int
    toolkit_port: int
    pool: ThreadPoolExecutor

    def run(self, case: Case, quiet_s: float = QUIET_S) -> Outcomes:
        """``case`` sent to uvicorn and to the toolkit at once (its target says which of
        the toolkit's paths serves it: the proxied copy's prefix, or direct ingress)."""
        uvicorn = self.pool.submit(exchange, self.uvicorn_port, case, quiet_s)
        toolkit = self.pool.submit(exchange, self.toolkit_port, case, quiet_s)
        return Outcomes(uvicorn.result(), toolkit.result())


@contextmanager
def uvicorn_echo(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """uvicorn serving the echo app on 127.0.0.1:``port`` with httptools and the
    websockets sans-I/O protocol (the toolkit's front builds on both)."""
    command = [
        sys.executable, "-m", "uvicorn", "tests.fuzz.echo_app:app", "--host", "127.0.0.1",
        "--port", str(port), "--http", "httptools", "--ws", "websockets-sansio",
        "--lifespan", "off", "--no-access-log", "--log-level", "error",
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: _answers(port), 30, "uvicorn to serve the echo app")
        yield process
    finally:
        process.terminate()
        process.wait(timeout=10)


def deploy_echo(name: str) -> list[str]:
    """The echo app on the running toolkit: direct ingress at "/", the proxied path at
    its prefix; returns the two applications' names."""
    tk.run(as_deployment(DirectEcho).bind(), name=f"{name}-direct", route_prefix="/")
    tk.run(as_deployment(ProxiedEcho).bind(), name=f"{name}-proxied", route_prefix=PROXIED_PREFIX)
    return [f"{name}-direct", f"{name}-proxied"]


def _answers(port: int) -> bool:
    try:
        return plain_http.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
