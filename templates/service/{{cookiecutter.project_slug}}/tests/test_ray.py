"""The same app on a real (local) Ray cluster, over real HTTP."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import app_toolkit as tk
import httpx
import pytest

from {{ cookiecutter.package_name }}.app import build_app
from {{ cookiecutter.package_name }}.settings import Settings


@pytest.fixture
def url() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
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
