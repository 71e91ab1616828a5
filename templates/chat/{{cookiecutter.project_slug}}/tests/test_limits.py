"""Per-key limits (the toolkit's): 429 with Retry-After in OpenAI's shape, over a key's
requests or tokens per window, for its requests with the key and the page's signed in
with it alike; a reply is charged its tokens, also one stopped half way."""

from __future__ import annotations

import json
import time

import app_toolkit as tk
import pytest
from starlette.websockets import WebSocketDisconnect

from {{ cookiecutter.package_name }}.app import build_app

from .conftest import ECHO, chat
from .test_access import bearer, entry, new_key
from .test_page import events

WINDOW_S = 4


def room_in_window(need_s: float = 1.5) -> None:
    """Wait for the next window if this one ends within ``need_s`` (windows start at
    multiples of their length of the clock), so that the requests below fall in one."""
    left = WINDOW_S - time.time() % WINDOW_S
    if left < need_s:
        time.sleep(left + 0.05)


def test_over_its_requests_limit_a_key_gets_429_with_retry_after_with_or_without_the_page() -> None:
    alice, bob = new_key(), new_key()
    keys = [entry("alice", alice, requests_per_window=3, window_s=WINDOW_S), entry("bob", bob)]
    with tk.testing.TestClient(build_app(ECHO), http_options={"api_keys": keys}) as client:
        room_in_window()
        assert client.post("/api/session", headers=bearer(alice)).status_code == 204  # one request
        assert client.post("/api/replies", json=chat("hi")).status_code == 201  # the page's: two
        assert client.post("/v1/chat/completions", json=chat("hi"), headers=bearer(alice)).status_code == 200
        for refused in (
            client.post("/v1/chat/completions", json=chat("hi"), headers=bearer(alice)),
            client.post("/api/replies", json=chat("hi")),  # signed in as alice: her limits
        ):
            assert refused.status_code == 429, refused.text
            error = refused.json()["error"]
            assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
            assert 1 <= int(refused.headers["retry-after"]) <= WINDOW_S
            assert refused.headers["x-ratelimit-limit-requests"] == "3"
        assert client.post("/v1/chat/completions", json=chat("hi"), headers=bearer(bob)).status_code == 200
        with pytest.raises(WebSocketDisconnect):  # a WebSocket is a request of the key too
            with client.websocket_connect("/v1/chat/ws", headers=bearer(alice)) as socket:
                socket.receive_json()
        with client.websocket_connect("/v1/chat/ws", headers=bearer(bob)) as socket:
            socket.send_json(chat("hi"))  # bob's are not limited
            assert socket.receive_json()["type"] == "start"


def charged(client: tk.testing.TestClient, key: str) -> float:
    """The tokens charged to ``key`` so far, as the toolkit's metrics count them."""
    prefix = 'app_toolkit_api_key_tokens_total{key="' + key + '"} '
    lines = [line for line in client.get("/-/metrics").text.splitlines() if line.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


def test_a_keys_replies_are_charged_their_tokens_also_a_reply_stopped_half_way() -> None:
    alice = new_key()
    keys = [entry("alice", alice, tokens_per_window=300, window_s=600)]  # (a window for the test)
    settings = ECHO.model_copy(update={"echo_tokens_per_s": 50})
    with tk.testing.TestClient(build_app(settings), http_options={"api_keys": keys}) as client:
        before = charged(client, "alice")  # (the process's count: other tests' keys named alice)
        reply_id = client.post("/api/replies", json=chat("word " * 100), headers=bearer(alice)).json()["id"]
        time.sleep(0.5)  # some words are out (50 a second)
        assert client.post(f"/api/replies/{reply_id}/stop", headers=bearer(alice)).status_code == 204
        done = events(client.get(f"/api/replies/{reply_id}/events", headers=bearer(alice)).text)[-1]
        shown = json.loads(done[2])["usage"]["completion_tokens"]
        assert 0 < shown < 100
        # The model charges the tokens it made: those shown, and the few it made while the
        # stop was on its way (a token each 20 ms: 5 is a stop that took 100 ms, as on a
        # loaded machine), never the whole reply's.
        deadline = time.monotonic() + 10
        while not 100 + shown <= charged(client, "alice") - before <= 100 + shown + 5:
            assert time.monotonic() < deadline, (charged(client, "alice") - before, shown)
            time.sleep(0.05)
        # Under 300, the key goes on; a reply that takes the window past it is its last.
        long = chat("word " * 100)
        assert client.post("/v1/chat/completions", json=long, headers=bearer(alice)).status_code == 200
        deadline = time.monotonic() + 10
        hi = chat("hi")
        while (refused := client.post("/v1/chat/completions", json=hi, headers=bearer(alice))).is_success:
            assert time.monotonic() < deadline, "the tokens were never charged"
            time.sleep(0.05)
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "tokens"
        assert refused.headers["x-ratelimit-limit-tokens"] == "300"


def test_each_message_of_a_websocket_is_a_request_of_its_key() -> None:
    carol = new_key()
    keys = [entry("carol", carol, requests_per_window=3, window_s=WINDOW_S)]
    with tk.testing.TestClient(build_app(ECHO), http_options={"api_keys": keys}) as client:
        room_in_window()
        with client.websocket_connect("/v1/chat/ws", headers=bearer(carol)) as socket:  # one
            for _ in range(2):  # two and three
                socket.send_json(chat("hi"))
                while socket.receive_json()["type"] != "done":
                    pass
            socket.send_json(chat("hi"))
            refused = socket.receive_json()
            assert refused["type"] == "error" and refused["error"]["code"] == "rate_limit_exceeded"
            socket.send_json({"bad": "request"})  # the socket stays open
            assert socket.receive_json()["error"]["code"] == "invalid_request"
