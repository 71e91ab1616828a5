"""The same app on a real (local) Ray cluster, over real HTTP."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import app_toolkit as tk
import httpx
import pytest

from chat.app import build_app

from .conftest import ECHO, chat


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
def test_chat_on_ray(url: str) -> None:
    tk.run(build_app(ECHO))
    with httpx.Client(base_url=url, timeout=60) as client:
        body = client.post("/v1/chat/completions", json=chat("hello from ray")).json()
        assert body["choices"][0]["message"]["content"] == "hello from ray"
        request = chat("streamed over http", stream=True)
        with client.stream("POST", "/v1/chat/completions", json=request) as response:
            data = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert data[-1] == "data: [DONE]" and len(data) == 6  # role, 3 pieces, finish, DONE
