"""The same app on a real (local) Ray cluster, over real HTTP."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import app_toolkit as tk
import httpx
import pytest

from {{ cookiecutter.package_name }}.app import build_app
from {{ cookiecutter.package_name }}.settings import Settings


def free_port() -> int:
    """A free port between Ray's worker ports (10002-19999) and Linux's ephemeral ones
    (32768 and up): no connection the starting cluster opens can take it first."""
    for port in random.sample(range(20000, 32000), 100):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000")


@pytest.fixture
def url() -> Iterator[str]:
    port = free_port()
    tk.start(http_options={"port": port}, backend="ray")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        tk.shutdown()


@pytest.mark.ray
def test_serves_on_ray(url: str) -> None:
    tk.run(build_app(Settings(replicas=2)))
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/hello/ray").json() == {"message": "Hello, ray!"}
        assert client.get("/-/healthz").status_code == 200
