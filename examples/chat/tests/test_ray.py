"""The same app on a real (local) Ray cluster, over real HTTP."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import app_toolkit as tk
import httpx
import pytest

from chat.app import build_app

from .conftest import ECHO, chat


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
def test_chat_on_ray(url: str) -> None:
    tk.run(build_app(ECHO))
    with httpx.Client(base_url=url, timeout=60) as client:
        body = client.post("/v1/chat/completions", json=chat("hello from ray")).json()
        assert body["choices"][0]["message"]["content"] == "hello from ray"
        request = chat("streamed over http", stream=True)
        with client.stream("POST", "/v1/chat/completions", json=request) as response:
            data = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert data[-1] == "data: [DONE]" and len(data) == 6  # role, 3 pieces, finish, DONE
