"""The API key check's pure parts (docs/security.md): the same work for every key, what a
peeked head presents, keys that fail at start without repeating a secret, open routes the
proxy can match, and ``app-toolkit keys new``. The front serving with keys:
tests/integration/test_api_keys.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi import FastAPI, Response
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.testclient import TestClient as StarletteClient

import app_toolkit as tk
from app_toolkit._runtime.front import key_check
from app_toolkit._runtime.front.path_match import AppMatcher
from app_toolkit._runtime.front.scope import read_headers
from app_toolkit._runtime.messages import DeploymentID, RouteInfo
from app_toolkit.cli import main
from app_toolkit.config import HTTPOptions, parse_http_options
from app_toolkit.config.api_keys import APIKey, digest_of, key_hash, new_key
from app_toolkit.exceptions import ConfigError
from app_toolkit.route_table import route_table

ALICE = new_key()
BOB = new_key()
RING_OPTIONS = HTTPOptions(api_keys=(APIKey(name="alice", hash=key_hash(ALICE)),))


def _holder(ring: key_check.KeyRing, headers: list[tuple[bytes, bytes]]) -> str | None:
    read = read_headers({"headers": headers})
    return ring.holder(read.authorization, read.api_key)


def test_the_check_does_the_same_work_whatever_is_presented() -> None:
    hashed: list[bytes] = []

    def counted(key: bytes) -> bytes:
        hashed.append(key)
        return digest_of(key)

    ring = key_check.KeyRing(RING_OPTIONS, counted)
    presented = {
        "right": [(b"authorization", f"Bearer {ALICE}".encode())],
        "wrong": [(b"authorization", f"Bearer {BOB}".encode())],
        "malformed": [(b"authorization", f"Token {ALICE}".encode())],
        "none": [],
    }
    names = {what: _holder(ring, headers) for what, headers in presented.items()}
    assert names == {"right": "alice", "wrong": None, "malformed": None, "none": None}
    assert len(hashed) == len(presented)  # one hash and one lookup each, whatever came


def test_a_key_sent_twice_opens_nothing() -> None:
    ring = key_check.KeyRing(RING_OPTIONS)
    right = (b"authorization", f"Bearer {ALICE}".encode())
    assert _holder(ring, [right]) == "alice"
    assert _holder(ring, [right, right]) is None
    assert _holder(ring, [(b"x-api-key", ALICE.encode())] * 2) is None


def test_a_peeked_head_opens_only_whole_and_with_a_valid_key() -> None:
    """What the acceptor asks before it hands a connection to a replica."""
    ring = key_check.KeyRing(RING_OPTIONS)
    keyed = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization:  Bearer {ALICE} \r\n\r\n".encode()
    assert ring.opens(keyed)
    assert ring.opens(f"GET / HTTP/1.1\r\nX-API-KEY: {ALICE}\r\n\r\nbody".encode())
    assert not ring.opens(keyed[:-2])  # the head is not whole: the proxy serves it
    assert not ring.opens(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    twice = f"GET / HTTP/1.1\r\nx-api-key: {ALICE}\r\nx-api-key: {ALICE}\r\n\r\n".encode()
    assert not ring.opens(twice)


def test_bad_keys_fail_at_start_naming_the_file_and_never_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Cannot read the API keys file .*keys.yaml"):
        parse_http_options({"api_keys_file": str(tmp_path / "keys.yaml")})
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"- {{name: a, hash: '{ALICE}'}}\n")  # the key pasted where its hash goes
    with pytest.raises(ConfigError, match="bad.yaml") as in_file:
        parse_http_options({"api_keys_file": str(bad)})
    bad.write_text(f"- {{name: a, hash: {ALICE}\n")  # not YAML either
    with pytest.raises(ConfigError, match=r"bad.yaml' is not valid YAML \(line") as not_yaml:
        parse_http_options({"api_keys_file": str(bad)})
    with pytest.raises(ConfigError, match="api_keys.0.hash") as in_options:
        parse_http_options({"api_keys": [{"name": "a", "hash": ALICE}], "dashboard_token": "t" * 16})
    twice = {"name": "a", "hash": key_hash(ALICE)}
    with pytest.raises(ConfigError, match="same name") as same:
        parse_http_options({"api_keys": [twice, {**twice, "hash": key_hash(BOB)}]})
    for error in (in_file, not_yaml, in_options, same):
        assert ALICE not in str(error.value) and key_hash(ALICE) not in str(error.value)
    assert "t" * 16 not in str(in_options.value)


def test_the_keys_file_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "keys.yaml").write_text("[]\n")
    monkeypatch.chdir(tmp_path)
    assert parse_http_options({"api_keys_file": "keys.yaml"}).api_keys_file == str(tmp_path / "keys.yaml")


def test_open_routes_are_in_the_proxys_table_and_after_no_route_it_cannot_match() -> None:
    app = FastAPI()

    @app.get("/health")
    @tk.open_route
    async def health() -> str:
        return "ok"

    @app.get("/private")
    async def private() -> str:
        return "secret"

    table = route_table(app)
    assert table.routes[-1].keyless and table.routes[-1].pattern.startswith("^/health")
    assert not any(route.keyless for route in table.routes[:-1])  # FastAPI's docs pages, first
    hosted = FastAPI()
    hosted.host("admin.example.com", FastAPI())
    hosted.get("/health")(tk.open_route(health))
    with pytest.raises(ConfigError, match="@open_route '/health' comes after 'a Host route'"):
        route_table(hosted)


def test_keys_new_prints_the_key_once_and_the_entry_that_opens_with_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["keys", "new", "carol", "--expires", "2099-01-31"])
    assert result.exit_code == 0, result.output
    key = result.output.splitlines()[1].strip()
    entry = result.output.splitlines()[3].strip()
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(entry + "\n")
    ring = key_check.KeyRing(HTTPOptions(api_keys_file=str(keys_file)))
    assert _holder(ring, [(b"x-api-key", key.encode())]) == "carol"
    assert key not in entry
    assert CliRunner().invoke(main, ["keys", "new", "no spaces"]).exit_code == 2


def _with_cors(**options: object) -> FastAPI:
    app = FastAPI()
    app.add_middleware(CORSMiddleware, **options)  # type: ignore[arg-type]
    return app


def test_the_front_answers_a_preflight_as_the_apps_own_cors_middleware() -> None:
    app = _with_cors(allow_origins=["https://a.example"], allow_methods=["*"], allow_headers=["x-api-key"])
    cors = route_table(app).cors
    assert cors is not None
    policy = AppMatcher(RouteInfo("/", "app", DeploymentID("app", "Ingress"), cors=cors)).cors
    asked = {"access-control-request-method": "POST", "access-control-request-headers": "x-api-key"}
    with StarletteClient(app) as client:
        for origin in ("https://a.example", "https://b.example"):
            headers = {"origin": origin, **asked}
            raw = [(name.encode(), value.encode()) for name, value in headers.items()]
            ours = key_check.preflight({"type": "http", "method": "OPTIONS", "headers": raw}, policy)
            assert ours is not None
            theirs = client.options("/x", headers=headers)
            assert (ours.status, ours.body) == (theirs.status_code, theirs.content)
            assert sorted(ours.headers) == sorted(theirs.headers.raw)
    not_one = {"type": "http", "method": "OPTIONS", "headers": []}
    assert key_check.preflight(not_one, policy) is None


@pytest.mark.parametrize(
    "options",
    [
        {"allow_origins": ["https://a.example"]},
        {"allow_origins": ["*"]},
        {"allow_origins": ["*"], "allow_credentials": True},
        {
            "allow_origins": ["https://a.example"],
            "allow_credentials": True,
            "expose_headers": ["x-request-id"],
        },
    ],
)
def test_the_fronts_refusals_carry_what_the_apps_cors_middleware_adds(options: dict[str, object]) -> None:
    """The 401 (and 429) the front answers itself get the headers the app's own middleware
    would add to an answer of the app, for any origin, cookie or none."""
    app = _with_cors(**options)

    @app.get("/refused")
    async def refused() -> Response:
        answer = key_check.unauthorized("r1")
        return Response(answer.body, answer.status, dict((k.decode(), v.decode()) for k, v in answer.headers))

    policy = AppMatcher(
        RouteInfo("/", "app", DeploymentID("app", "Ingress"), cors=route_table(app).cors)
    ).cors
    with StarletteClient(app) as client:
        for origin in ("https://a.example", "https://b.example"):
            for cookie in ({}, {"cookie": "session=1"}):
                headers = {"origin": origin, **cookie}
                raw = [(name.encode(), value.encode()) for name, value in headers.items()]
                scope = {"type": "http", "method": "GET", "headers": raw}
                ours = asyncio.run(key_check.with_cors(key_check.unauthorized("r1"), scope, policy))
                theirs = client.get("/refused", headers=headers)
                assert _cors_of(ours.headers) == _cors_of(theirs.headers.raw), (options, headers)


def _cors_of(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return sorted(h for h in headers if h[0].startswith(b"access-control-") or h[0] == b"vary")


def test_only_starlettes_own_cors_middleware_outermost_and_plain_is_taken() -> None:
    assert route_table(FastAPI()).cors is None
    assert route_table(_with_cors(allow_origins={"https://b", "https://a"})).cors == (
        ("allow_origins", ("https://a", "https://b")),
    )

    class Mine(CORSMiddleware):
        pass

    subclassed = FastAPI()
    subclassed.add_middleware(Mine, allow_origins=["*"])
    assert route_table(subclassed).cors is None
    inner = _with_cors(allow_origins=["*"])
    inner.add_middleware(GZipMiddleware)  # outside it: the app's answer is not the policy's alone
    assert route_table(inner).cors is None
    assert route_table(_with_cors(allow_origins=[object()])).cors is None


def test_the_hash_of_an_empty_key_is_refused() -> None:
    """An empty header presents the empty key: no entry may open for it."""
    with pytest.raises(ConfigError, match="SHA-256 of an empty key"):
        parse_http_options({"api_keys": [{"name": "empty", "hash": "sha256:" + digest_of(b"").hex()}]})
