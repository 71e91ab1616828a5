"""API keys (the toolkit's, checked at its front), the page's sign-in with one, and the
page's requests counted as its key's, on the in-process backend."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator

import app_toolkit as tk
import pytest
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect

from {{ cookiecutter.package_name }}.access import COOKIE, ReplyIds, Sessions
from {{ cookiecutter.package_name }}.app import build_app
from {{ cookiecutter.package_name }}.settings import Settings

from .conftest import ECHO, chat
from .test_page import events


def new_key() -> str:
    """A key as ``app-toolkit keys new`` makes one (any 256 random bits do)."""
    return "sk-" + secrets.token_urlsafe(32)


def entry(name: str, key: str, **limits: object) -> dict[str, object]:
    """The toolkit's entry for ``key``: its name and SHA-256, and its limits."""
    return {"name": name, "hash": "sha256:" + hashlib.sha256(key.encode()).hexdigest(), **limits}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


ALICE, BOB = new_key(), new_key()
KEYS = [entry("alice", ALICE), entry("bob@example.com", BOB)]


@pytest.fixture(scope="module")
def keyed() -> Iterator[tk.testing.TestClient]:
    app = build_app(ECHO.model_copy(update={"echo_tokens_per_s": 50}))
    with tk.testing.TestClient(app, http_options={"api_keys": KEYS}) as client:
        yield client


def test_settings_that_cannot_work_fail_at_start_saying_how_to_fix_them() -> None:
    with pytest.raises(ValidationError, match="at least 32 characters"):
        Settings(session_secret="short")


def test_sign_in_cookies_cannot_be_forged_altered_or_kept_past_their_time() -> None:
    sessions = Sessions(b"s" * 32, ttl_s=60)
    cookie = sessions.issue("alice", now=1000)
    assert sessions.owner_of(cookie, now=1059) == "alice"
    assert sessions.owner_of(cookie, now=1061) is None  # expired
    name, expiry, signature = cookie.split(".")
    assert sessions.owner_of(f"{name}.{int(expiry) + 3600}.{signature}", now=1000) is None
    forged = Sessions(b"x" * 32, ttl_s=60).issue("alice", now=1000)
    assert sessions.owner_of(forged, now=1000) is None
    assert sessions.owner_of("garbage", now=1000) is None


def test_without_a_valid_key_the_api_answers_401_in_openais_shape(keyed: tk.testing.TestClient) -> None:
    keyed.cookies.clear()
    missing = keyed.post("/v1/chat/completions", json=chat("hi"))
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = keyed.post("/v1/chat/completions", json=chat("hi"), headers=bearer(ALICE + "x"))
    assert wrong.status_code == 401 and wrong.json() == missing.json()
    assert keyed.get("/v1/models").status_code == 401
    refused = keyed.post("/api/replies", json=chat("hi"))  # the page's API: no key, no sign-in
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert keyed.get("/").status_code == 200  # the page itself asks for the key
    answered = keyed.post("/v1/chat/completions", json=chat("red green"), headers=bearer(ALICE))
    assert answered.status_code == 200
    assert answered.json()["choices"][0]["message"]["content"] == "red green"


def test_the_page_signs_in_with_a_cookie_and_never_keeps_the_key(keyed: tk.testing.TestClient) -> None:
    keyed.cookies.clear()
    assert keyed.get("/api/session").status_code == 401
    refused = keyed.post("/api/session", headers=bearer("sk-wrong"))
    assert refused.status_code == 401 and COOKIE not in refused.cookies
    signed = keyed.post("/api/session", headers=bearer(ALICE))
    assert signed.status_code == 204
    header = signed.headers["set-cookie"].lower()
    assert "httponly" in header and "samesite=strict" in header and ALICE.lower() not in header
    assert keyed.get("/api/session").json() == {"keys": True, "owner": "alice"}
    reply = keyed.post("/api/replies", json=chat("one two"))
    assert reply.status_code == 201
    whole = events(keyed.get(f"/api/replies/{reply.json()['id']}/events").text)
    assert [kind for _, kind, _ in whole] == ["token", "token", "done"]
    assert keyed.delete("/api/session").status_code == 204
    assert keyed.get("/api/session").status_code == 401


def test_a_websocket_without_a_key_is_refused_and_with_one_it_chats(keyed: tk.testing.TestClient) -> None:
    keyed.cookies.clear()
    with pytest.raises(WebSocketDisconnect):
        with keyed.websocket_connect("/v1/chat/ws") as socket:
            socket.receive_json()
    with keyed.websocket_connect("/v1/chat/ws", headers=bearer(ALICE)) as socket:
        socket.send_json(chat("red green"))
        assert socket.receive_json()["type"] == "start"
        while (message := socket.receive_json())["type"] == "delta":
            pass
        assert message["type"] == "done"


def test_a_reply_is_read_and_stopped_only_by_the_key_that_started_it(keyed: tk.testing.TestClient) -> None:
    keyed.cookies.clear()
    reply_id = keyed.post("/api/replies", json=chat("word " * 100), headers=bearer(BOB)).json()["id"]
    nonce, _ = reply_id.split(".")
    for attempt in (
        keyed.get(f"/api/replies/{reply_id}/events", headers=bearer(ALICE)),
        keyed.post(f"/api/replies/{reply_id}/stop", headers=bearer(ALICE)),
        keyed.get(f"/api/replies/{nonce}/events", headers=bearer(BOB)),  # the signature left out
        keyed.get(f"/api/replies/{nonce}.{'0' * 32}/events", headers=bearer(BOB)),  # forged
    ):
        assert attempt.status_code == 404, attempt.text
        assert attempt.json()["error"]["code"] == "reply_not_found"
    # Alice's attempts changed nothing: Bob stops his reply and reads it whole.
    assert keyed.post(f"/api/replies/{reply_id}/stop", headers=bearer(BOB)).status_code == 204
    whole = events(keyed.get(f"/api/replies/{reply_id}/events", headers=bearer(BOB)).text)
    assert whole[-1][1] == "done" and json.loads(whole[-1][2])["finish_reason"] == "stopped"


def test_reply_ids_check_out_only_for_their_owner_and_secret() -> None:
    ids = ReplyIds(b"s" * 32)
    reply_id = ids.issue("bob")
    assert ids.owns(reply_id, "bob")
    assert not ids.owns(reply_id, "alice")
    assert not ids.owns(reply_id, "")
    assert not ReplyIds(b"t" * 32).owns(reply_id, "bob")  # another deploy's secret
    assert ids.issue("bob") != reply_id
    for bad in ("", ".", reply_id.split(".")[0], reply_id + "0", "../" + reply_id, reply_id * 2):
        assert not ids.owns(bad, "bob"), bad
