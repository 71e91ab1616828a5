"""Per-key limits: 429 with Retry-After in OpenAI's shape, over requests or tokens per minute."""

from __future__ import annotations

import asyncio
import time

import app_toolkit as tk

from {{ cookiecutter.package_name }}.accounts import MemoryLedger
from {{ cookiecutter.package_name }}.app import build_app

from .conftest import ECHO, chat
from .test_access import ALICE, BOB, ENTRIES, bearer


def test_over_its_limits_a_key_gets_429_with_retry_after() -> None:
    settings = ECHO.model_copy(update={"api_keys": ENTRIES, "requests_per_min": 2, "tokens_per_min": 1000})
    with tk.testing.TestClient(build_app(settings)) as client:
        for _ in range(2):
            assert (
                client.post("/v1/chat/completions", json=chat("hi"), headers=bearer(ALICE)).status_code == 200
            )
        refused = client.post("/v1/chat/completions", json=chat("hi"), headers=bearer(ALICE))
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
        assert 1 <= int(refused.headers["retry-after"]) <= 30  # a request's allowance refills in 30 s
        assert client.post("/v1/chat/completions", json=chat("hi"), headers=bearer(BOB)).status_code == 200
        with client.websocket_connect("/v1/chat/ws", headers=bearer(ALICE)) as socket:
            socket.send_json(chat("hi"))
            assert socket.receive_json()["error"]["code"] == "rate_limit_exceeded"  # the socket stays open

    settings = ECHO.model_copy(
        update={"api_keys": ENTRIES, "tokens_per_min": 100, "echo_tokens_per_s": 10_000}
    )
    with tk.testing.TestClient(build_app(settings)) as client:
        long = chat("word " * 150)  # 300 tokens: three minutes' worth
        assert client.post("/v1/chat/completions", json=long, headers=bearer(ALICE)).status_code == 200
        deadline = time.monotonic() + 10
        while (
            refused := client.post("/v1/chat/completions", json=chat("hi"), headers=bearer(ALICE))
        ).is_success:
            assert time.monotonic() < deadline, "the tokens were never counted"
            time.sleep(0.05)
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "tokens"
        assert 60 <= int(refused.headers["retry-after"]) <= 121  # until the debt is back within a minute


def test_the_memory_ledger_lets_a_minutes_burst_in_then_one_per_interval() -> None:
    async def body() -> None:
        ledger = MemoryLedger(requests_per_min=60, tokens_per_min=0)
        assert [await ledger.admit("a") for _ in range(60)] == [None] * 60
        refused = await ledger.admit("a")
        assert refused is not None and refused.kind == "requests" and 0 < refused.retry_after_s <= 1.0
        assert await ledger.admit("b") is None  # per key
        assert (await ledger.usage("a"))["requests"] == 60  # refused requests are not counted

    asyncio.run(body())
