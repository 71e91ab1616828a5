"""The chat put on the internet, on Ray: API keys, per-key limits kept in Redis and
enforced across two ingress replicas (429 with Retry-After), usage per key, the LLM
metrics in the scrape, and the page signing in with a key in headless Chromium."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

import app_toolkit as tk
from examples.chat.chat import keys
from examples.chat.chat.app import build_app
from examples.chat.chat.settings import Settings
from tests.browser import chromium
from tests.conftest import Toolkit
from tests.waiting import wait_for

ALICE, BOB = keys.new_key(), keys.new_key()
RUN = uuid.uuid4().hex[:8]  # the Redis of the session outlives a deploy: owners of this run only


def chat(text: str) -> dict[str, object]:
    return {"model": "echo", "messages": [{"role": "user", "content": text}]}


@pytest.fixture
def keyed_chat(ray_toolkit: Toolkit, redis_url: str) -> str:
    settings = Settings(
        backend="echo",
        echo_tokens_per_s=200,
        api_keys=[f"alice-{RUN}:{keys.key_hash(ALICE)}", f"bob-{RUN}:{keys.key_hash(BOB)}"],
        requests_per_min=4,
        accounts_store="redis",
        redis_url=redis_url,
        ingress_replicas=2,
    )
    name = ray_toolkit.name()
    ray_toolkit.run(build_app(settings), name=name, route_prefix="/")
    assert len(tk.status().applications[name].deployments["Ingress"].replicas) == 2
    assert len(tk.status().applications[name].deployments["Accounts"].replicas) == 2
    return ray_toolkit.url


def test_limits_hold_across_ingress_replicas_and_usage_is_counted(keyed_chat: str) -> None:
    alice = {"Authorization": f"Bearer {ALICE}"}
    with httpx.Client(base_url=keyed_chat, timeout=30) as client:
        assert client.post("/v1/chat/completions", json=chat("hi")).status_code == 401
        for _ in range(4):  # spread over both ingress replicas, counted in one place
            answered = client.post("/v1/chat/completions", json=chat("one two three"), headers=alice)
            assert answered.status_code == 200, answered.text
        refused = client.post("/v1/chat/completions", json=chat("one"), headers=alice)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(refused.headers["retry-after"]) <= 15
        deadline = time.monotonic() + 10
        while (usage := client.get("/v1/usage", headers=alice).json())["completion_tokens"] < 12:
            assert time.monotonic() < deadline, usage
            time.sleep(0.1)
        assert usage["requests"] == 4 and usage["prompt_tokens"] == 12 and usage["completion_tokens"] == 12
        metrics = client.get("/-/metrics").text
    counted = [line for line in metrics.splitlines() if line.startswith("chat_tokens_total{")]
    assert any(f'owner="alice-{RUN}"' in line and 'kind="completion"' in line for line in counted), counted
    assert "chat_time_to_first_token_seconds_bucket" in metrics
    assert "chat_inter_token_latency_seconds_bucket" in metrics


def test_the_page_signs_in_with_a_key_and_waits_out_its_limit(keyed_chat: str) -> None:
    with chromium() as browser:
        page = browser.new_page()
        try:
            page.goto(keyed_chat)
            wait_for(lambda: page.locator("#signin").is_visible(), timeout_s=10)
            assert page.locator("#composer").is_hidden()
            page.fill("#key", "sk-chat-wrong")
            page.press("#key", "Enter")
            wait_for(lambda: "Incorrect API key" in page.locator("#status").inner_text(), timeout_s=10)
            page.fill("#key", BOB)
            page.press("#key", "Enter")
            wait_for(lambda: page.locator("#composer").is_visible(), timeout_s=10)
            assert BOB not in page.content()  # the page keeps no key
            for number in range(4):
                page.fill("#prompt", f"hello {number}")
                page.press("#prompt", "Enter")
                wait_for(lambda: page.evaluate("document.body.dataset.busy") == "no", timeout_s=20)
                assert page.locator(".message.assistant").last.inner_text() == f"hello {number}"
            page.fill("#prompt", "one too many")
            page.press("#prompt", "Enter")
            wait_for(lambda: "Rate limit reached" in page.locator("#status").inner_text(), timeout_s=10)
            assert page.evaluate("document.body.dataset.busy") == "yes"  # waiting, not failed
            page.click("#stop")
            page.click("#signout")
            wait_for(lambda: page.locator("#signin").is_visible(), timeout_s=10)
        finally:
            page.close()
