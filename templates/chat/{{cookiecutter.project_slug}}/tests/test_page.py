"""The page and its resumable reply API, on the in-process backend."""

from __future__ import annotations

import json
import time

import app_toolkit as tk

from .conftest import chat


def events(text: str) -> list[tuple[str, str, str]]:
    """(id, event, data) of each SSE event in ``text``."""
    found = []
    for block in text.replace("\r\n", "\n").strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            found.append((fields.get("id", ""), fields["event"], fields.get("data", "")))
    return found


def test_page_and_assets(client: tk.testing.TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "<textarea" in page.text and 'data-model="echo"' in page.text
    assert client.get("/static/chat.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/../settings.py").status_code == 404
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert 'rel="icon"' in page.text


def test_reply_resumes_after_the_last_event_id(client: tk.testing.TestClient) -> None:
    reply = client.post("/api/replies", json=chat("one two three four"))
    assert reply.status_code == 201
    url = f"/api/replies/{reply.json()['id']}/events"
    whole = events(client.get(url).text)
    assert [kind for _, kind, _ in whole] == ["token"] * 4 + ["done"]
    second = whole[1][0]  # ids are the store's own: opaque to readers
    resumed = events(client.get(url, headers={"Last-Event-ID": second}).text)
    assert resumed == whole[2:]  # the rest, nothing repeated
    assert events(client.get(url, params={"after": second}).text) == whole[2:]
    assert client.get(url, headers={"Last-Event-ID": "not-an-id"}).status_code == 400


def test_stop_ends_the_reply_on_the_model(client: tk.testing.TestClient) -> None:
    reply_id = client.post("/api/replies", json=chat("word " * 400)).json()["id"]
    time.sleep(0.2)  # some words are out
    assert client.post(f"/api/replies/{reply_id}/stop").status_code == 204
    whole = events(client.get(f"/api/replies/{reply_id}/events").text)
    last = whole[-1]
    assert last[1] == "done" and json.loads(last[2])["finish_reason"] == "stopped"
    said = sum(kind == "token" for _, kind, _ in whole)
    assert said > 0 and json.loads(last[2])["usage"]["completion_tokens"] == said  # counted, though cut short
    assert client.get("/api/stats").json()["active"] == 0
    assert client.post("/api/replies/nope/stop").status_code == 404


def test_with_keys_off_everyone_is_let_in_and_nothing_is_counted(client: tk.testing.TestClient) -> None:
    assert client.get("/api/session").json() == {"keys": False, "owner": ""}
    assert client.get("/v1/usage").status_code == 404
