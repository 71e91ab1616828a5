"""API keys at the front door (docs/security.md): a real front on 127.0.0.1 on the local
backend, with keys in the options and in a keys file, read by httpx and websockets."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import Depends, FastAPI, WebSocket
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

import app_toolkit as tk
from app_toolkit._runtime.front import key_check
from app_toolkit.config.api_keys import key_hash, new_key
from tests.conftest import free_port
from tests.deployments import as_deployment

ALICE = new_key()
OLD = new_key()  # expired
BOB = new_key()  # only in the file, later

api = FastAPI()


@api.get("/who")
async def who(name: str | None = Depends(tk.api_key_name)) -> dict[str, str | None]:
    return {"key": name}


@api.get("/signin")
@tk.open_route
async def sign_in(name: str | None = Depends(tk.api_key_name)) -> dict[str, object]:
    return {"open": True, "key": name}


@api.websocket("/live")
async def live(socket: WebSocket) -> None:
    await socket.accept()
    await socket.send_text(str(tk.api_key_name(socket)))
    await socket.close()


@tk.deployment
@tk.ingress(api)
class Guarded:
    pass


@pytest.fixture
def keyed(no_backend: None, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The local backend with ALICE and OLD in the options, a keys file, and the app."""
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text("[]\n")
    port = free_port()
    expired = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    tk.start(
        backend="local",
        http_options={
            "host": "127.0.0.1",
            "port": port,
            "api_keys": [
                {"name": "alice", "hash": key_hash(ALICE)},
                {"name": "old", "hash": key_hash(OLD), "expires_at": expired},
            ],
            "api_keys_file": str(keys_file),
        },
    )
    try:
        tk.run(as_deployment(Guarded).bind(), name="guarded", route_prefix="/", backend="local")
        yield f"http://127.0.0.1:{port}", keys_file
    finally:
        tk.shutdown()


def _refused(response: httpx.Response) -> None:
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_only_a_valid_key_opens_the_apps_routes(
    keyed: tuple[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = keyed
    caplog.set_level(logging.DEBUG)
    with httpx.Client(base_url=url, timeout=10) as client:
        refusals = [
            client.get("/who"),
            client.get("/who", headers={"authorization": f"Basic {ALICE}"}),  # malformed
            client.get("/who", headers={"authorization": "Bearer"}),
            client.get("/who", headers={"authorization": f"Bearer {ALICE}x"}),  # unknown
            client.get("/who", headers={"x-api-key": OLD}),  # expired
            client.post("/who", headers={"x-api-key": "nope"}, content=b"x" * 1000),
            client.head("/who"),
            client.options("/who"),
        ]
        for response in refusals[:-2]:
            _refused(response)
        assert len({r.content.replace(r.headers["x-request-id"].encode(), b"") for r in refusals[:-2]}) == 1
        assert [r.status_code for r in refusals[-2:]] == [401, 401]
        assert client.get("/who", headers={"authorization": f"Bearer {ALICE}"}).json() == {"key": "alice"}
        assert client.get("/who", headers={"authorization": f"bearer  {ALICE}"}).json() == {"key": "alice"}
        assert client.get("/who", headers={"x-api-key": ALICE}).json() == {"key": "alice"}
        # An open route lets anyone in, and names the key of one who sends it.
        assert client.get("/signin").json() == {"open": True, "key": None}
        assert client.get("/signin", headers={"x-api-key": ALICE}).json() == {"open": True, "key": "alice"}
        # The toolkit's pages keep their own rules: health checks stay open.
        assert client.get("/-/healthz").status_code == 200
        page = client.get("/-/metrics").text  # loopback may read it
    assert 'app_toolkit_api_key_requests_total{key="alice"} 4' in page
    assert "app_toolkit_api_key_refusals_total 8" in page
    # No key, hash or header value reaches a log line or a metric.
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "/who" in logged  # the access lines were captured
    for secret in (ALICE, OLD, key_hash(ALICE), key_hash(ALICE)[7:], key_hash(OLD)[7:]):
        assert secret not in logged and secret not in page


def test_a_websocket_without_a_key_is_refused_before_it_is_accepted(keyed: tuple[str, Path]) -> None:
    url, _ = keyed
    ws_url = url.replace("http", "ws") + "/live"
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url, open_timeout=10)
    assert refused.value.response.status_code == 401
    assert refused.value.response.headers["www-authenticate"] == "Bearer"
    with connect(ws_url, additional_headers={"authorization": f"Bearer {ALICE}"}, open_timeout=10) as socket:
        assert socket.recv(timeout=10) == "alice"


def test_keys_in_the_file_come_and_go_without_a_restart(keyed: tuple[str, Path]) -> None:
    url, keys_file = keyed
    with httpx.Client(base_url=url, timeout=10) as client:
        _refused(client.get("/who", headers={"x-api-key": BOB}))
        keys_file.write_text(f"keys:\n  - {{name: bob, hash: '{key_hash(BOB)}'}}\n")
        assert _eventually(lambda: client.get("/who", headers={"x-api-key": BOB}).status_code == 200)
        assert client.get("/who", headers={"x-api-key": BOB}).json() == {"key": "bob"}
        keys_file.write_text("keys: [{name: bob, hash: nonsense}]\n")  # a bad edit keeps the keys
        time.sleep(key_check.FILE_CHECK_S * 1.5)
        assert client.get("/who", headers={"x-api-key": BOB}).status_code == 200
        keys_file.write_text("[]\n")  # revoked
        assert _eventually(lambda: client.get("/who", headers={"x-api-key": BOB}).status_code == 401)
        assert client.get("/who", headers={"x-api-key": ALICE}).status_code == 200  # the options' stay


def _eventually(check: Callable[[], bool], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False
