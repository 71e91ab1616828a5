"""The parts of uvicorn the proxy relies on beyond its public API, named one by one.

``front/http_guard.py`` subclasses uvicorn's httptools protocol (a private class) to add
limits and hooks uvicorn does not offer (``front/uvicorn_compat.py`` lists them).
pyproject.toml caps uvicorn at the newest release tested; when a new uvicorn is taken
(``make compat``), this test says which assumption broke, before any behaviour test
fails in a less obvious way.
"""

from __future__ import annotations

import asyncio
import inspect
import tomllib
import types
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from packaging.requirements import Requirement
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from app_toolkit._runtime.front import uvicorn_compat
from app_toolkit._runtime.front.request_link import REQUEST_LINK, ConnectionLink
from tests.unit.connections import KeptTransport, guarded

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

#: Methods of HttpToolsProtocol that GuardedHttpProtocol overrides and calls through.
OVERRIDDEN = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "on_response_complete",
    "send_400_response",
)
#: Attributes of a protocol instance it reads or sets.
PROTOCOL_STATE = (
    "connections",
    "loop",
    "timeout_keep_alive",
    "cycle",
    "scope",
    "transport",
    "client",
    "flow",
    "pipeline",
)
#: Attributes of a request's cycle it reads or sets.
CYCLE_STATE = (
    "disconnected",
    "transport",
    "scope",
    "response_complete",
    "keep_alive",
    "message_event",
    "more_body",
    "waiting_for_100_continue",
    "flow",
)


def _declared(package: str) -> Requirement:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return next(Requirement(item) for item in dependencies if Requirement(item).name == package)


@pytest.mark.parametrize("package", ["uvicorn", "fastapi", "starlette", "ray", "pydantic"])
def test_the_installed_version_is_in_the_declared_range(package: str) -> None:
    requirement = _declared(package)
    assert requirement.specifier.contains(version(package)), (package, version(package), requirement)


@pytest.mark.parametrize(
    ("package", "capped"), [("uvicorn", True), ("ray", True), ("fastapi-offline", True), ("fastapi", False)]
)
def test_only_a_package_whose_internals_we_use_is_capped(package: str, capped: bool) -> None:
    """uvicorn and Ray: their compat modules list the internals; fastapi-offline: its
    static/ folder (test_docs_pages); the cap is the newest release line the suite passed
    on (``make compat`` tries the next). FastAPI's internals are read with a fallback
    (``fastapi_compat``), so it has none."""
    uppers = [spec for spec in _declared(package).specifier if spec.operator in ("<", "<=", "==", "~=")]
    assert bool(uppers) == capped, (package, uppers)


def test_the_protocol_methods_it_overrides_exist_with_their_signatures() -> None:
    expected = {
        "connection_made": ["self", "transport"],
        "connection_lost": ["self", "exc"],
        "data_received": ["self", "data"],
        "on_message_begin": ["self"],
        "on_headers_complete": ["self"],
        "on_response_complete": ["self"],
        "send_400_response": ["self", "msg"],
    }
    for name in OVERRIDDEN:
        method = getattr(HttpToolsProtocol, name)
        assert list(inspect.signature(method).parameters) == expected[name], name
    assert callable(HttpToolsProtocol.timeout_keep_alive_handler)


def test_the_websocket_protocol_makes_its_scope_where_the_client_certificate_joins_it() -> None:
    """``WebSocketProtocol.handle_connect`` calls through, then adds the certificate."""
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    method = WebSocketsSansIOProtocol.handle_connect
    assert list(inspect.signature(method).parameters) == ["self", "event"]


@pytest.mark.skipif(
    uvicorn_compat.RELEASE < (0, 39), reason="0.38's HEADER_RE has a misplaced bracket (reply_check.py)"
)
def test_a_replicas_reply_is_held_to_uvicorns_header_rules() -> None:
    """reply_check.py writes out uvicorn's rule for header names and values: the same
    bytes are refused."""
    from uvicorn.protocols.http import httptools_impl

    from app_toolkit._runtime.front import reply_check

    for byte in (bytes([b]) for b in range(256)):
        assert bool(reply_check.HEADER_RE.search(byte)) == bool(httptools_impl.HEADER_RE.search(byte)), byte
        assert bool(reply_check.HEADER_VALUE_RE.search(byte)) == bool(
            httptools_impl.HEADER_VALUE_RE.search(byte)
        )


@pytest.mark.anyio
async def test_a_request_goes_through_the_state_it_relies_on() -> None:
    seen: dict[str, object] = {}

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        seen["link"] = scope.get(REQUEST_LINK)

    protocol = guarded(app)
    assert isinstance(protocol, HttpToolsProtocol)
    for name in PROTOCOL_STATE:
        assert hasattr(protocol, name), name
    transport = KeptTransport()
    protocol.connection_made(transport)
    assert protocol.timeout_keep_alive_task is not None  # the guard arms it for silent clients
    protocol.data_received(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    cycle = protocol.cycle
    assert isinstance(cycle, RequestResponseCycle)
    for name in CYCLE_STATE:
        assert hasattr(cycle, name), name
    # The guard gave the cycle its write-joining transport and the request its link.
    assert cycle.transport is not transport
    await asyncio.sleep(0.05)  # the app runs as a task
    assert isinstance(seen["link"], ConnectionLink)
    protocol.connection_lost(None)


@pytest.mark.anyio
async def test_the_link_says_whether_a_body_piece_is_waiting() -> None:
    # Direct ingress bounds a wait for the body only when there is one to wait for.
    ready: list[bool] = []
    headers_only = asyncio.Event()

    async def app(scope: dict[str, object], receive: Any, send: object) -> None:
        link = scope[REQUEST_LINK]
        assert isinstance(link, ConnectionLink)
        ready.append(link.body_ready())
        headers_only.set()
        await asyncio.sleep(0.05)  # the body arrives meanwhile
        ready.append(link.body_ready())
        await receive()

    protocol = guarded(app)
    assert isinstance(protocol, HttpToolsProtocol)
    protocol.connection_made(KeptTransport())
    protocol.data_received(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\n")
    await asyncio.wait_for(headers_only.wait(), 5)
    protocol.data_received(b"abcd")
    await asyncio.sleep(0.2)
    assert ready == [False, True]
    protocol.connection_lost(None)


@pytest.mark.anyio
async def test_the_link_says_whether_the_body_is_still_arriving() -> None:
    # A deadline that passes then is the upload's (408): while the connection reads the
    # body, not once it is whole, nor while it holds back because the app took nothing
    # (uvicorn pauses reading), nor while the client waits for 100 Continue.
    links: list[ConnectionLink] = []

    async def app(scope: dict[str, object], receive: Any, send: object) -> None:
        link = scope[REQUEST_LINK]
        assert isinstance(link, ConnectionLink)
        links.append(link)
        await asyncio.sleep(60)  # it reads nothing

    async def arriving(head: bytes, *pieces: bytes) -> bool:
        protocol = guarded(app)
        protocol.connection_made(KeptTransport())
        protocol.data_received(head)
        for piece in pieces:
            protocol.data_received(piece)
        await asyncio.sleep(0)  # the app's task starts
        try:
            return links[-1].body_arriving()
        finally:
            protocol.connection_lost(None)

    post = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n"
    assert await arriving(post % 10 + b"\r\n", b"abcd")  # 6 bytes still with the client
    assert not await arriving(post % 10 + b"\r\n", b"abcd", b"efghij")  # whole
    assert not await arriving(post % 200_000 + b"\r\n", b"x" * 100_000)  # held back
    assert not await arriving(post % 10 + b"expect: 100-continue\r\n\r\n")  # told nothing yet
    assert not await arriving(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")  # no body at all
    assert len(links) == 5


@pytest.mark.anyio
async def test_a_server_without_listeners_takes_connections_made_elsewhere() -> None:
    """server.py runs uvicorn with no listener (serve(sockets=[])) and builds protocols
    for sockets accepted elsewhere as uvicorn does: config.http_protocol_class with
    the server's server_state and its lifespan's state."""
    assert "sockets" in inspect.signature(uvicorn.Server.serve).parameters
    assert list(inspect.signature(HttpToolsProtocol.__init__).parameters)[:4] == [
        "self",
        "config",
        "server_state",
        "app_state",
    ]
    ws = uvicorn_compat.WebSocketProtocol  # as the front serves (uvicorn's "auto" may warn)
    config = uvicorn.Config(lambda scope, receive, send: None, lifespan="off", log_config=None, ws=ws)
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        assert isinstance(server.server_state, ServerState)
        assert isinstance(server.lifespan.state, dict)
        assert server.server_state.connections == set()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@pytest.mark.anyio
async def test_the_websocket_protocol_holds_its_sends_while_the_transport_is_paused() -> None:
    """Every uvicorn in range: a slow reader pauses the app's sends (the buffer has a bound),
    and a connection lost while paused lets a waiting send end."""
    ws = uvicorn_compat.WebSocketProtocol
    config = uvicorn.Config(lambda scope, receive, send: None, lifespan="off", log_config=None, ws=ws)
    config.load()
    protocol = uvicorn_compat.WebSocketProtocol(config=config, server_state=ServerState(), app_state={})
    protocol.connection_made(KeptTransport())
    protocol.pause_writing()
    assert not protocol.writable.is_set()
    protocol.resume_writing()
    assert protocol.writable.is_set()
    protocol.pause_writing()
    protocol.connection_lost(None)
    assert protocol.writable.is_set()


def test_the_400_for_unparsable_bytes_only_writes_and_closes() -> None:
    """``GuardedHttpProtocol.send_400_response`` gives uvicorn's a stand-in transport that
    can only write and note a close (then it lingers instead: front/linger.py)."""
    calls: list[str] = []

    class WritesAndCloses:
        def write(self, data: bytes) -> None:
            calls.append("write")

        def close(self) -> None:
            calls.append("close")

    protocol = types.SimpleNamespace(
        server_state=types.SimpleNamespace(default_headers=[]), transport=WritesAndCloses()
    )
    HttpToolsProtocol.send_400_response(protocol, "Invalid HTTP request received.")  # type: ignore[arg-type]
    assert calls == ["write", "close"]


def test_a_refused_websocket_handshake_from_a_client_with_a_certificate_is_answered() -> None:
    """uvicorn makes no scope for a handshake it refuses: the certificate goes nowhere."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    class Certified:
        def getpeercert(self, binary_form: bool = False) -> bytes:
            return b"a certificate"

    class Transport:
        def __init__(self) -> None:
            self.written: list[bytes] = []
            self.closed = False

        def get_extra_info(self, name: str, default: object = None) -> object:
            extra = {"ssl_object": Certified(), "peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}
            return extra.get(name, default)

        def write(self, data: bytes) -> None:
            self.written.append(data)

        def close(self) -> None:
            self.closed = True

        def is_closing(self) -> bool:
            return self.closed

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("a refused handshake reaches no app")

    loop = asyncio.new_event_loop()
    try:
        config = Config(app=app, ws=uvicorn_compat.WebSocketProtocol, lifespan="off")
        protocol = uvicorn_compat.WebSocketProtocol(
            config=config, server_state=ServerState(), app_state={}, _loop=loop
        )
        transport = Transport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(
            b"GET / HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        )
        assert transport.written[0].startswith(b"HTTP/1.1 400") and transport.closed
    finally:
        loop.close()
