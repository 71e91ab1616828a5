"""API keys at the front door (docs/security.md): a real front on 127.0.0.1 on the local
backend, with keys in the options and in a keys file, read by httpx and websockets."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import re
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import openai
import pytest
from fastapi import Depends, FastAPI, Request, Response, WebSocket
from fastapi.middleware.cors import CORSMiddleware
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

import app_toolkit as tk
from app_toolkit._runtime.backends.base import current_session
from app_toolkit.config.api_keys import UNAUTHORIZED_MESSAGE, key_hash, new_key
from app_toolkit.llm import build_openai_app
from tests.conftest import free_port
from tests.deployments import as_deployment

ALICE = new_key()
OLD = new_key()  # expired
BOB = new_key()  # only in the file, later
LIMITED = new_key()  # 2 requests per 2-s window
SINGLE = new_key()  # 1 request at a time
METERED = new_key()  # 40 tokens per 4-s window (a reply and a wait fit in one)
URGENT = new_key()  # priority class -3
WINDOW_S = 2.0

api = FastAPI()
REACHED: list[str] = []  # the method of every request its routes saw (local backend: this process)


@api.middleware("http")  # inside the CORS middleware (added after it: the outermost)
async def count(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    REACHED.append(request.method)
    return await call_next(request)


api.add_middleware(
    CORSMiddleware,
    allow_origins=["https://chat.example"],
    allow_methods=["*"],
    allow_headers=["authorization"],
)


@api.get("/who")
async def who(name: str | None = Depends(tk.api_key_name)) -> dict[str, str | None]:
    return {"key": name}


@api.get("/signin")
@tk.open_route
async def sign_in(name: str | None = Depends(tk.api_key_name)) -> dict[str, object]:
    return {"open": True, "key": name}


@api.get("/v1/models")
async def models() -> dict[str, object]:
    return {"object": "list", "data": []}


RELEASE = threading.Event()  # /hold answers once it is set (local backend: this process)
HOLDING = threading.Event()


@api.get("/hold")
async def hold() -> dict[str, bool]:
    HOLDING.set()
    return {"released": await asyncio.to_thread(RELEASE.wait, 30)}


@api.websocket("/live")
async def live(socket: WebSocket) -> None:
    await socket.accept()
    await socket.send_text(str(tk.api_key_name(socket)))
    await socket.close()


@api.get("/priority")
async def priority(request: Request) -> dict[str, int]:
    """The key's priority class here and in a handle call made for the request."""
    reader = vars(tk.get_replica_context().servable_object)["reader"]
    return {"here": tk.get_request_priority(), "called": await reader.remote()}


@api.get("/by-cookie")
@tk.open_route
async def by_cookie(request: Request, hold: bool = False, twice: bool = False) -> dict[str, object]:
    """An open route whose app names its caller's key by a cookie (a real app signs it)."""
    if twice:  # an app that tries again after a refusal
        with contextlib.suppress(tk.APIKeyRefused):
            await tk.admit_key(request, request.cookies.get("caller"))
    admitted = await tk.admit_key(request, request.cookies.get("caller"))
    if hold:
        HOLDING.set()
        await asyncio.to_thread(RELEASE.wait, 30)
    reader = vars(tk.get_replica_context().servable_object)["reader"]
    return {
        "admitted": admitted,
        "key": tk.api_key_name(request),
        "here": tk.get_request_priority(),
        "called": await reader.remote(),
    }


@tk.deployment
class PriorityReader:
    def __call__(self) -> int:
        return tk.get_request_priority()


@tk.deployment
@tk.ingress(api)
class Guarded:
    def __init__(self, reader: tk.DeploymentHandle[PriorityReader]) -> None:
        self.reader = reader


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The local backend with ALICE and OLD in the options, a keys file, and the app, for
    the module's tests (the shared backend is stopped first, as ``no_backend`` does)."""
    if current_session(create=False) is not None:
        tk.shutdown()
    keys_file = tmp_path_factory.mktemp("keys") / "keys.yaml"
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
                {
                    "name": "limited",
                    "hash": key_hash(LIMITED),
                    "requests_per_window": 2,
                    "window_s": WINDOW_S,
                },
                {"name": "single", "hash": key_hash(SINGLE), "max_concurrent_requests": 1},
                {"name": "urgent", "hash": key_hash(URGENT), "priority": -3, "weight": 2},
                {
                    "name": "metered",
                    "hash": key_hash(METERED),
                    "tokens_per_window": 40,
                    "window_s": 2 * WINDOW_S,
                },
            ],
            "api_keys_file": str(keys_file),
        },
    )
    try:
        reader = as_deployment(PriorityReader).bind()
        tk.run(as_deployment(Guarded).bind(reader), name="guarded", route_prefix="/", backend="local")
        echo = {"model_loading_config": {"model_id": "echo"}, "llm_engine": "echo"}
        tk.run(build_openai_app({"llm_configs": [echo]}), name="llm", route_prefix="/llm", backend="local")
        yield f"http://127.0.0.1:{port}", keys_file
    finally:
        tk.shutdown()


def _refused(response: httpx.Response) -> None:
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert response.json()["error"]["type"] == "invalid_request_error"


def _counted(client: httpx.Client) -> tuple[float, float]:
    """alice's admissions and the refusals, as /-/metrics shows them now."""
    page = client.get("/-/metrics").text  # loopback may read it
    admitted = re.search(r'^app_toolkit_api_key_requests_total\{key="alice"\} (\S+)$', page, re.M)
    refused = re.search(r"^app_toolkit_api_key_refusals_total (\S+)$", page, re.M)
    return (float(admitted[1]) if admitted else 0.0), (float(refused[1]) if refused else 0.0)


def _replica_requests(client: httpx.Client) -> float:
    """The requests the app's replicas finished, as /-/metrics counts them now."""
    page = client.get("/-/metrics").text
    lines = re.findall(
        r'^app_toolkit_replica_requests_total\{[^}]*application="guarded"[^}]*\} (\S+)$', page, re.M
    )
    return sum(float(value) for value in lines)


def test_only_a_valid_key_opens_the_apps_routes(
    keyed: tuple[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = keyed
    caplog.set_level(logging.DEBUG)
    with httpx.Client(base_url=url, timeout=10) as client:
        admitted_before, refused_before = _counted(client)
        refusals = [
            client.get("/who"),
            client.get("/who", headers={"authorization": f"Basic {ALICE}"}),  # malformed
            client.get("/who", headers={"authorization": "Bearer"}),
            client.get("/who", headers={"authorization": f"Bearer {ALICE}x"}),  # unknown
            client.get("/who", headers={"x-api-key": OLD}),  # expired
            client.get("/who", headers=[("x-api-key", ALICE), ("x-api-key", "other")]),  # twice
            # Refused before anything else of the request is looked at.
            client.post("/who", headers={"x-api-key": "nope"}, content=b"x" * 1000),
            client.get("/who", headers={"x-request-timeout-seconds": "never"}),
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
        admitted, refused = _counted(client)
        page = client.get("/-/metrics").text
    assert (admitted - admitted_before, refused - refused_before) == (4, len(refusals))
    # No key, hash or header value reaches a log line or a metric.
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "/who" in logged  # the access lines were captured
    for secret in (ALICE, OLD, key_hash(ALICE)[7:], key_hash(OLD)[7:]):
        assert secret not in logged and secret not in page


def test_a_keys_priority_class_reaches_the_app_and_its_handle_calls(keyed: tuple[str, Path]) -> None:
    url, _ = keyed
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.get("/priority", headers={"x-api-key": URGENT}).json() == {"here": -3, "called": -3}
        assert client.get("/priority", headers={"x-api-key": ALICE}).json() == {"here": 0, "called": 0}


@pytest.mark.parametrize(
    "target",
    ["//who", "/%77ho", "/who?x=1", "http://127.0.0.1/who", "/signin/../who", "/%2Fwho"],
)
def test_no_target_form_reaches_a_keyed_route_without_a_key(keyed: tuple[str, Path], target: str) -> None:
    url, _ = keyed
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while piece := raw.recv(65536):
            answer += piece
    status = int(answer.split(b" ", 2)[1])
    assert status in (401, 404), answer  # refused, or a path no route serves: never the app's 200
    assert b'"key"' not in answer


def test_a_websocket_without_a_key_is_refused_before_it_is_accepted(keyed: tuple[str, Path]) -> None:
    url, _ = keyed
    ws_url = url.replace("http", "ws") + "/live"
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url, open_timeout=10)
    assert refused.value.response.status_code == 401
    assert refused.value.response.headers["www-authenticate"] == "Bearer"
    with connect(ws_url, additional_headers={"authorization": f"Bearer {ALICE}"}, open_timeout=10) as socket:
        assert socket.recv(timeout=10) == "alice"


def test_keys_in_the_file_come_and_go_without_a_restart(
    keyed: tuple[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    url, keys_file = keyed
    with httpx.Client(base_url=url, timeout=10) as client:

        def bob() -> int:
            return client.get("/who", headers={"x-api-key": BOB}).status_code

        _refused(client.get("/who", headers={"x-api-key": BOB}))
        keys_file.write_text(f"keys:\n  - {{name: bob, hash: '{key_hash(BOB)}'}}\n")
        assert _eventually(lambda: bob() == 200)
        assert client.get("/who", headers={"x-api-key": BOB}).json() == {"key": "bob"}
        keys_file.write_text("keys: [{name: bob, hash: nonsense}]\n")  # a bad edit keeps the keys
        # (The file is looked at when requests come.)
        assert _eventually(lambda: bob() == 200 and "the keys read before it stay in use" in caplog.text)
        keys_file.write_text(f"- {{name: bob, hash: '{key_hash(BOB)}'}}\n")
        keys_file.unlink()  # gone: its keys go with it
        assert _eventually(lambda: bob() == 401)
        assert "its keys are revoked" in caplog.text
        keys_file.write_text(f"- {{name: bob, hash: '{key_hash(BOB)}'}}\n")
        assert _eventually(lambda: bob() == 200)
        keys_file.write_text("[]\n")  # revoked
        assert _eventually(lambda: bob() == 401)
        assert client.get("/who", headers={"x-api-key": ALICE}).status_code == 200  # the options' stay


def _eventually(check: Callable[[], bool], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_a_cors_preflight_is_answered_by_the_apps_policy_before_the_key_check(
    keyed: tuple[str, Path],
) -> None:
    """A browser sends no key with a preflight: the front answers it as the app's own
    CORSMiddleware would, and it reaches no app code; the request after it needs its key."""
    url, _ = keyed
    asked = {"origin": "https://chat.example", "access-control-request-method": "POST"}
    with httpx.Client(base_url=url, timeout=10) as client:
        REACHED.clear()
        served_before = _replica_requests(client)
        allowed = client.options("/who", headers={**asked, "access-control-request-headers": "authorization"})
        other = client.options("/who", headers={**asked, "origin": "https://evil.example"})
        assert _replica_requests(client) == served_before  # the app's replica saw neither
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "https://chat.example"
        assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
        assert other.status_code == 400 and other.text == "Disallowed CORS origin"
        # Not a preflight: refused, with the headers the app's policy gives its own answers
        # (a page of that origin reads the 401), the same as on the answer that gets in.
        refused = client.get("/who", headers={"origin": "https://chat.example"})
        _refused(refused)
        keyed_get = client.get("/who", headers={"origin": "https://chat.example", "x-api-key": ALICE})
        for answer in (refused, keyed_get):
            assert answer.headers["access-control-allow-origin"] == "https://chat.example"
            assert answer.headers["vary"] == "Origin"
        assert (
            "access-control-allow-origin"
            not in client.get("/who", headers={"origin": "https://evil.example"}).headers
        )
        assert REACHED == ["GET"]
        assert _eventually(lambda: _replica_requests(client) > served_before)  # (it counts)


def test_the_official_openai_client_sends_its_key_as_the_front_reads_it(keyed: tuple[str, Path]) -> None:
    url, _ = keyed
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.models.list()
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    right = openai.OpenAI(base_url=f"{url}/v1", api_key=ALICE, max_retries=0)
    assert right.models.list().data == []


def _window_start(window_s: float = WINDOW_S) -> None:
    """Wait for the start of a limit window (the ledger's windows start at multiples of
    their length of the clock this process shares with it), so the test's requests fall in
    one window."""
    time.sleep(window_s - time.time() % window_s + 0.05)


def _rate_limited(client: httpx.Client, key: str, limit: str) -> float:
    page = client.get("/-/metrics").text
    found = re.search(
        rf'^app_toolkit_api_key_rate_limited_total\{{key="{key}",limit="{limit}"\}} (\S+)$', page, re.M
    )
    return float(found[1]) if found else 0.0


def test_requests_over_a_keys_window_get_429_with_openais_headers(keyed: tuple[str, Path]) -> None:
    url, _ = keyed
    with httpx.Client(base_url=url, timeout=10, headers={"x-api-key": LIMITED}) as client:
        _window_start()
        assert [client.get("/who").status_code for _ in range(2)] == [200, 200]
        reached = len(REACHED)
        over = client.get("/who")
        assert over.status_code == 429 and len(REACHED) == reached  # no app saw it
        assert over.json()["error"]["code"] == "rate_limit_exceeded"
        assert over.headers["x-ratelimit-limit-requests"] == "2"
        assert over.headers["x-ratelimit-remaining-requests"] == "0"
        assert 1 <= int(over.headers["retry-after"]) <= WINDOW_S
        assert re.fullmatch(r"\d+(ms|s)", over.headers["x-ratelimit-reset-requests"])
        assert over.headers["x-request-id"]
        assert (
            client.get("/who", headers={"origin": "https://chat.example"}).headers[
                "access-control-allow-origin"
            ]
            == "https://chat.example"
        )  # a page of the app's origin reads the 429
        # A WebSocket is a request of the key too: refused before it is accepted.
        with pytest.raises(InvalidStatus) as refused:
            connect(
                url.replace("http", "ws") + "/live",
                additional_headers={"x-api-key": LIMITED},
                open_timeout=10,
            )
        assert refused.value.response.status_code == 429
        assert _rate_limited(client, "limited", "requests") >= 2
        # Another key has its own count.
        assert client.get("/who", headers={"x-api-key": ALICE}).status_code == 200


def test_the_openai_client_waits_out_a_429_and_its_retry_succeeds(keyed: tuple[str, Path]) -> None:
    url, _ = keyed
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=LIMITED, max_retries=2)
    with httpx.Client(base_url=url) as plain:
        _window_start()
        limited_before = _rate_limited(plain, "limited", "requests")
        started = time.monotonic()
        for _ in range(3):  # the third waits for the next window and gets in then
            assert client.models.list().data == []
        assert _rate_limited(plain, "limited", "requests") == limited_before + 1
    assert time.monotonic() - started >= WINDOW_S - 1  # it waited for Retry-After


def test_concurrent_requests_over_a_keys_limit_get_429_until_one_ends(keyed: tuple[str, Path]) -> None:
    url, _ = keyed
    HOLDING.clear()
    RELEASE.clear()
    with httpx.Client(base_url=url, timeout=30, headers={"x-api-key": SINGLE}) as client:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(client.get, "/hold")
            assert HOLDING.wait(10)
            over = client.get("/who")
            assert over.status_code == 429 and over.headers["retry-after"] == "1"
            assert "at most 1 at once" in over.json()["error"]["message"]
            assert "x-ratelimit-limit-requests" not in over.headers  # no window limit
            RELEASE.set()
            assert first.result(timeout=30).json() == {"released": True}
        assert client.get("/who").json() == {"key": "single"}
        assert _rate_limited(client, "single", "concurrent") >= 1


def test_an_llm_keys_requests_get_429_once_its_replies_used_the_windows_tokens(
    keyed: tuple[str, Path],
) -> None:
    """The OpenAI app charges each reply's prompt and completion tokens to the caller's key
    (the echo engine: a token a byte); once a window's are used, 429 with OpenAI's tokens
    headers, until the window ends."""
    url, _ = keyed
    client = openai.OpenAI(base_url=f"{url}/llm/v1", api_key=METERED, max_retries=0)
    said = "x" * 30
    _window_start(2 * WINDOW_S)
    reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": said}])
    assert reply.usage is not None and reply.usage.total_tokens >= 60  # over 40 in one reply
    time.sleep(0.7)  # the charge reaches the ledger, and the front's count is old
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "y"}])
    headers = refused.value.response.headers
    assert headers["x-ratelimit-limit-tokens"] == "40" and headers["x-ratelimit-remaining-tokens"] == "0"
    assert refused.value.code == "rate_limit_exceeded" and refused.value.type == "tokens"
    assert 1 <= int(headers["retry-after"]) <= 2 * WINDOW_S
    time.sleep(int(headers["retry-after"]))  # the next window
    assert client.models.list().data[0].id == "echo"
    # Every key's tokens are counted by name, a key without a tokens limit's too.
    alice = openai.OpenAI(base_url=f"{url}/llm/v1", api_key=ALICE, max_retries=0)
    alice.chat.completions.create(model="echo", messages=[{"role": "user", "content": said}])
    with httpx.Client(base_url=url) as plain:
        page = plain.get("/-/metrics").text
    counted = dict(re.findall(r'^app_toolkit_api_key_tokens_total\{key="(\w+)"\} (\S+)$', page, re.M))
    assert float(counted["metered"]) >= reply.usage.total_tokens
    assert float(counted["alice"]) >= reply.usage.total_tokens


def test_an_open_route_lets_a_request_in_as_the_key_its_app_names(keyed: tuple[str, Path]) -> None:
    url, _ = keyed
    with httpx.Client(base_url=url, timeout=30) as client:
        named = client.get("/by-cookie", headers=_cookie("urgent"))
        assert named.json() == {"admitted": True, "key": "urgent", "here": -3, "called": -3}
        for caller in ("", "nobody", "old"):  # none, unknown, expired
            refused = client.get("/by-cookie", headers=_cookie(caller))
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            assert refused.json() == {"detail": UNAUTHORIZED_MESSAGE}
        # A request that presented a key is that key's.
        own = client.get("/by-cookie", headers={"cookie": "caller=alice", "x-api-key": ALICE})
        assert own.json()["key"] == "alice"
        other = client.get("/by-cookie", headers={"cookie": "caller=urgent", "x-api-key": ALICE})
        assert other.json()["key"] == "alice"  # whatever the cookie says

        # The key's limits hold, as for a request that presented it.
        _window_start()
        limited = _cookie("limited")
        assert [client.get("/by-cookie", headers=limited).status_code for _ in range(2)] == [200, 200]
        over = client.get("/by-cookie", headers=limited)
        assert over.status_code == 429 and over.headers["x-ratelimit-limit-requests"] == "2"
        again = client.get("/by-cookie", params={"twice": "true"}, headers=limited)
        assert again.status_code == 429  # an app that asks again after a 429 is refused again
        assert 1 <= int(over.headers["retry-after"]) <= WINDOW_S
        assert over.json()["detail"].startswith("Rate limit reached for requests")

        # Its concurrent slot is held while the request runs, and given back as it ends.
        HOLDING.clear()
        RELEASE.clear()
        single = _cookie("single")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(client.get, "/by-cookie", params={"hold": "true"}, headers=single)
            try:
                assert HOLDING.wait(10)
                assert client.get("/by-cookie", headers=single).status_code == 429
                assert client.get("/who", headers={"x-api-key": SINGLE}).status_code == 429
            finally:
                RELEASE.set()
            assert first.result(timeout=30).json()["key"] == "single"
        assert client.get("/by-cookie", headers=single).json()["key"] == "single"


def _cookie(caller: str) -> dict[str, str]:
    return {"cookie": f"caller={caller}"} if caller else {}
