"""When the service is full it says so: 503 with Retry-After, in OpenAI's error shape."""

from __future__ import annotations

from collections.abc import Iterator

import app_toolkit as tk
import pytest

from {{ cookiecutter.package_name }}.app import build_app

from .conftest import ECHO, chat


@pytest.fixture(scope="module")
def full_client() -> Iterator[tk.testing.TestClient]:
    settings = ECHO.model_copy(update={"max_replies": 1, "echo_tokens_per_s": 20})
    with tk.testing.TestClient(build_app(settings)) as client:
        yield client


def test_a_full_reply_store_answers_503_with_retry_after(full_client: tk.testing.TestClient) -> None:
    running = full_client.post("/api/replies", json=chat("word " * 100))
    assert running.status_code == 201
    refused = full_client.post("/api/replies", json=chat("me too"))
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "overloaded"
    assert full_client.post(f"/api/replies/{running.json()['id']}/stop").status_code == 204
