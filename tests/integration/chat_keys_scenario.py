"""The chat example put on the internet, on an embedded Ray cluster of its own whose proxy
asks for API keys: the toolkit's keys and limits across two ingress replicas, tokens
charged per key, the page signing in with a key and its requests counted as that key's
(over HTTP, and in headless Chromium waiting out the limit), and an app without direct
ingress letting a request in as a key its route names (``tk.admit_key`` in a replica
with no front of its own).

Runs in a fresh process (``test_chat_keys.py``). Prints one JSON line."""

from __future__ import annotations

import json
import re
import sys
import time

import httpx
from fastapi import APIRouter, Request

import app_toolkit as tk
from app_toolkit.config.api_keys import key_hash, new_key
from examples.chat.chat.app import build_app
from examples.chat.chat.settings import Settings
from tests.browser import chromium
from tests.waiting import wait_for

ALICE, BOB, CAROL, DAVE = new_key(), new_key(), new_key(), new_key()
WINDOW_S = 60
KEYS = [
    {"name": "alice", "hash": key_hash(ALICE), "requests_per_window": 4, "window_s": WINDOW_S},
    {"name": "bob", "hash": key_hash(BOB)},
    {"name": "carol", "hash": key_hash(CAROL), "requests_per_window": 3, "window_s": WINDOW_S},
    {"name": "dave", "hash": key_hash(DAVE), "requests_per_window": 1, "window_s": WINDOW_S, "priority": -2},
]

router = APIRouter()


@router.get("/who")
@tk.open_route
async def who(request: Request) -> dict[str, object]:
    """Lets the request in as the key its ``caller`` cookie names (a real app signs it)."""
    await tk.admit_key(request, request.cookies.get("caller"))
    return {"key": tk.api_key_name(request), "priority": tk.get_request_priority()}


def chat(text: str) -> dict[str, object]:
    return {"model": "echo", "messages": [{"role": "user", "content": text}]}


def room_in_window(need_s: float) -> None:
    """Wait for the next window if this one ends within ``need_s`` (the ledger's windows
    start at multiples of their length of the clock this machine shares)."""
    left = WINDOW_S - time.time() % WINDOW_S
    if left < need_s:
        time.sleep(left + 0.1)


def metric(page: str, name: str, labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (``a="x",b="y"``: each
    replica's process has its own sample)."""
    wanted = labels.split(",")
    total = 0.0
    for found in re.finditer(rf"^{name}\{{(.*)\}} (\S+)$", page, re.M):
        if all(label in found[1].split(",") for label in wanted):
            total += float(found[2])
    return total


def api(url: str, seen: dict[str, object]) -> None:
    alice, bob = {"Authorization": f"Bearer {ALICE}"}, {"Authorization": f"Bearer {BOB}"}
    with httpx.Client(base_url=url, timeout=30) as client:
        refused = client.post("/v1/chat/completions", json=chat("hi"))
        seen["no_key"] = [refused.status_code, refused.json()["error"]["code"]]
        room_in_window(10)
        codes = []
        for _ in range(5):  # new connections: spread over both ingress replicas, counted as one
            with httpx.Client(base_url=url, timeout=30) as fresh:
                over = fresh.post("/v1/chat/completions", json=chat("one two three"), headers=alice)
                codes.append(over.status_code)
        seen["alice"] = codes
        seen["alice_429"] = [over.json()["error"]["code"], over.headers.get("x-ratelimit-limit-requests")]
        assert client.post("/v1/chat/completions", json=chat("one two three"), headers=bob).is_success

        def charged() -> str | None:
            text = client.get("/-/metrics").text
            return text if metric(text, "app_toolkit_api_key_tokens_total", 'key="bob"') >= 6 else None

        page = wait_for(charged, 15, "bob's tokens charged")
        seen["bob_tokens"] = metric(page, "app_toolkit_api_key_tokens_total", 'key="bob"')
        seen["bob_chat_tokens"] = metric(page, "chat_tokens_total", 'kind="completion",owner="bob"')
        seen["llm_metrics"] = [
            "chat_time_to_first_token_seconds_bucket" in page,
            "chat_inter_token_latency_seconds_bucket" in page,
        ]


def page_over_http(url: str, seen: dict[str, object]) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        seen["page_signed_out"] = client.get("/api/session").status_code
        signed = client.post("/api/session", headers={"Authorization": f"Bearer {BOB}"})
        seen["page_sign_in"] = [signed.status_code, "httponly" in signed.headers["set-cookie"].lower()]
        seen["page_session"] = client.get("/api/session").json()
        reply = client.post("/api/replies", json=chat("red green")).json()["id"]
        events = client.get(f"/api/replies/{reply}/events").text
        seen["page_reply"] = [line for line in events.splitlines() if line.startswith("event:")]


def page_in_chromium(url: str, seen: dict[str, object]) -> None:
    with chromium() as browser:
        page = browser.new_page()
        try:
            page.goto(url)
            wait_for(lambda: page.locator("#signin").is_visible(), 10, "the sign-in form")
            page.fill("#key", "sk-wrong")
            page.press("#key", "Enter")
            wait_for(lambda: "Incorrect API key" in page.locator("#status").inner_text(), 10, "the refusal")
            room_in_window(20)  # carol's sign-in and three messages in one window
            page.fill("#key", CAROL)
            page.press("#key", "Enter")
            wait_for(lambda: page.locator("#composer").is_visible(), 10, "the composer")
            seen["page_keeps_no_key"] = CAROL not in page.content()
            answered = 0
            for number in range(6):  # the sign-in, then a request a message: the third is over
                page.fill("#prompt", f"hello {number}")
                page.press("#prompt", "Enter")
                wait_for(
                    lambda: (
                        page.evaluate("document.body.dataset.busy") == "no"
                        or "Rate limit reached" in page.locator("#status").inner_text()
                    ),
                    20,
                    "a reply or the limit",
                )
                if "Rate limit reached" in page.locator("#status").inner_text():
                    break
                assert page.locator(".message.assistant").last.inner_text() == f"hello {number}"
                answered += 1
            seen["page_answered"] = answered
            seen["page_waits"] = page.evaluate("document.body.dataset.busy") == "yes"  # waiting, not failed
            page.click("#stop")
            page.click("#signout")
            wait_for(lambda: page.locator("#signin").is_visible(), 10, "the sign-in form again")
        finally:
            page.close()


def by_name(url: str, seen: dict[str, object]) -> None:
    room_in_window(5)
    with httpx.Client(base_url=url, timeout=30) as client:
        first = client.get("/by-name/who", headers={"cookie": "caller=dave"})
        over = client.get("/by-name/who", headers={"cookie": "caller=dave"})
        nobody = client.get("/by-name/who", headers={"cookie": "caller=nobody"})
        seen["by_name"] = [first.status_code, first.json(), over.status_code, nobody.status_code]


def main(port: int) -> None:
    seen: dict[str, object] = {}
    url = f"http://127.0.0.1:{port}"
    tk.start(http_options={"host": "127.0.0.1", "port": port, "api_keys": KEYS})
    tk.run(build_app(Settings(backend="echo", echo_tokens_per_s=200, ingress_replicas=2)), name="chat")
    tk.run(tk.App(router, name="by-name", direct_ingress=False), name="by-name", route_prefix="/by-name")
    seen["ingress_replicas"] = len(tk.status().applications["chat"].deployments["Ingress"].replicas)
    api(url, seen)
    page_over_http(url, seen)
    page_in_chromium(url, seen)
    by_name(url, seen)
    tk.shutdown()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
