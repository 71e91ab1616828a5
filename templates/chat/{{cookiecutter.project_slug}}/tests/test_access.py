"""API keys, the page's sign-in, per-key limits (429) and usage, on the in-process backend."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import app_toolkit as tk
import pytest
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect

from {{ cookiecutter.package_name }} import keys
from {{ cookiecutter.package_name }}.access import COOKIE, KeyRing, ReplyIds, Sessions
from {{ cookiecutter.package_name }}.app import build_app
from {{ cookiecutter.package_name }}.settings import Settings

from .conftest import ECHO, chat
from .test_page import events

ALICE, BOB = keys.new_key(), keys.new_key()
ENTRIES = [f"alice:{keys.key_hash(ALICE)}", f"bob@example.com:{keys.key_hash(BOB)}"]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keyed() -> Iterator[tk.testing.TestClient]:
    settings = ECHO.model_copy(
        update={"api_keys": ENTRIES, "requests_per_min": 1000, "echo_tokens_per_s": 50}
    )
    with tk.testing.TestClient(build_app(settings)) as client:
        yield client


def test_keys_are_made_and_kept_as_hashes(capsys: pytest.CaptureFixture[str]) -> None:
    assert ALICE.startswith(keys.PREFIX) and len(ALICE) > 40 and ALICE != BOB
    ring = KeyRing(ENTRIES)
    assert ring.owner_of(ALICE) == "alice" and ring.owner_of(BOB) == "bob@example.com"
    assert ring.owner_of(ALICE[:-1]) is None and ring.owner_of("") is None
    with pytest.raises(ValueError, match="not OWNER:SHA256"):
        keys.check_entries([ALICE])  # the key itself, pasted where its hash belongs
    with pytest.raises(ValueError, match="same key twice"):
        keys.check_entries([ENTRIES[0], "carol:" + keys.key_hash(ALICE)])
    assert keys.main(["carol"]) == 0
    printed = capsys.readouterr().out
    made = printed.split("it is not kept anywhere): ")[1].split()[0]
    assert f"carol:{keys.key_hash(made)}" in printed
    assert keys.main(["bad owner!"]) == 2


def test_settings_that_cannot_work_fail_at_start_saying_how_to_fix_them() -> None:
    with pytest.raises(ValidationError, match=f"lists no key: make one with {re.escape(keys.MAKER)}"):
        Settings(require_keys=True)
    with pytest.raises(ValidationError, match="not OWNER:SHA256"):
        Settings(api_keys=["alice:abc"])
    with pytest.raises(ValidationError, match="at least 32 characters"):
        Settings(api_keys=ENTRIES, session_secret="short")
    assert Settings(require_keys=True, api_keys=ENTRIES).keys_on


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
    missing = keyed.post("/v1/chat/completions", json=chat("hi"))
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    wrong = keyed.post("/v1/chat/completions", json=chat("hi"), headers=bearer(ALICE + "x"))
    assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "Incorrect API key provided."
    assert keyed.get("/v1/models").status_code == 401
    assert keyed.post("/api/replies", json=chat("hi")).status_code == 401
    assert keyed.get("/").status_code == 200  # the page itself asks for the key
    answered = keyed.post("/v1/chat/completions", json=chat("red green"), headers=bearer(ALICE))
    assert answered.status_code == 200
    assert answered.json()["choices"][0]["message"]["content"] == "red green"


def test_usage_counts_each_keys_requests_and_tokens_also_of_a_reply_stopped_half_way(
    keyed: tk.testing.TestClient,
) -> None:
    before = keyed.get("/v1/usage", headers=bearer(BOB)).json()
    assert before["owner"] == "bob@example.com" and before["limits"]["requests_per_min"] == 1000
    keyed.post("/v1/chat/completions", json=chat("one two three"), headers=bearer(BOB))
    reply_id = keyed.post("/api/replies", json=chat("word " * 200), headers=bearer(BOB)).json()["id"]
    time.sleep(0.5)  # some words are out (50 a second)
    assert keyed.post(f"/api/replies/{reply_id}/stop", headers=bearer(BOB)).status_code == 204
    done = events(keyed.get(f"/api/replies/{reply_id}/events", headers=bearer(BOB)).text)[-1]
    stopped = json.loads(done[2])["usage"]
    assert 0 < stopped["completion_tokens"] < 200
    expected = {
        "requests": before["requests"] + 2,
        "prompt_tokens": before["prompt_tokens"] + 3 + 200,
        "completion_tokens": before["completion_tokens"] + 3 + stopped["completion_tokens"],
    }
    # The reply reports the tokens it showed; the model charges the tokens it made, which
    # may be one more: a token made while the stop was on its way, never shown.
    also = {**expected, "completion_tokens": expected["completion_tokens"] + 1}
    deadline = time.monotonic() + 10
    while True:  # the model counts a reply's tokens as it ends, without holding the reply up
        after = {name: keyed.get("/v1/usage", headers=bearer(BOB)).json()[name] for name in expected}
        if after in (expected, also) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert after in (expected, also), after
    alice = keyed.get("/v1/usage", headers=bearer(ALICE)).json()
    assert alice["owner"] == "alice"  # each key sees its own counts only


def test_the_page_signs_in_with_a_cookie_and_never_keeps_the_key(keyed: tk.testing.TestClient) -> None:
    keyed.cookies.clear()
    assert keyed.get("/api/session").status_code == 401
    refused = keyed.post("/api/session", json={"key": "sk-chat-wrong"})
    assert refused.status_code == 401 and COOKIE not in refused.cookies
    signed = keyed.post("/api/session", json={"key": ALICE})
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


def test_a_websocket_without_a_key_is_closed_and_with_one_it_chats(keyed: tk.testing.TestClient) -> None:
    keyed.cookies.clear()
    with pytest.raises(WebSocketDisconnect) as closed:
        with keyed.websocket_connect("/v1/chat/ws") as socket:
            socket.receive_json()
    assert closed.value.code == 1008
    with keyed.websocket_connect("/v1/chat/ws", headers=bearer(ALICE)) as socket:
        socket.send_json(chat("red green"))
        assert socket.receive_json()["type"] == "start"
        while (message := socket.receive_json())["type"] == "delta":
            pass
        assert message["type"] == "done"


def test_a_reply_is_read_and_stopped_only_by_the_key_that_started_it(keyed: tk.testing.TestClient) -> None:
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
