"""WebSockets through the proxy, on both backends, with the real `websockets` client."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

import app_toolkit as tk
from tests.apps import basic, serve_compat
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for


def ws_url(toolkit: Toolkit, path: str) -> str:
    return toolkit.url.replace("http://", "ws://") + path


def test_text_binary_and_close_codes(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_ws_app(), route_prefix="/wsapp")
    with connect(ws_url(toolkit, "/wsapp/ws/echo")) as ws:
        ws.send("hello")
        assert ws.recv(timeout=10) == "echo:hello"
        ws.send(b"\x01\x02\x03")
        assert ws.recv(timeout=10) == b"\x03\x02\x01"
        ws.send("close-4001")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "asked to close")
    with pytest.raises(InvalidStatus) as denied, connect(ws_url(toolkit, "/wsapp/ws/deny")):
        pass
    assert denied.value.response.status_code == 403


def test_a_websocket_to_the_toolkits_own_pages_never_reaches_an_app(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_catch_all_ws_app(), name=toolkit.name(), route_prefix="/")
    with connect(ws_url(toolkit, "/anywhere")) as ws:  # the root app takes every other path
        assert ws.recv(timeout=10) == "/anywhere"
    for path in ("/-/x", "/-/healthz", "/-/dashboard/events"):  # as GET /-/x is the front's 404
        with pytest.raises(InvalidStatus) as refused, connect(ws_url(toolkit, path)):
            pass
        assert refused.value.response.status_code == 403, path


def test_connections_are_pinned_and_spread_over_replicas(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_ws_app(num_replicas=2), route_prefix="/wspin")
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(connect(ws_url(toolkit, "/wspin/ws/who"))) for _ in range(12)]
        tokens = []
        for ws in sockets:
            ws.send("who")
            first = ws.recv(timeout=10)
            ws.send("again")
            assert ws.recv(timeout=10) == first  # one replica for the connection's life
            tokens.append(first)
    # All 12 were open at once, each holding a slot: they spread over both replicas.
    assert len(set(tokens)) == 2


def test_overload_closes_1013_for_browsers_and_503_for_others(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_ws_app(max_ongoing_requests=1, max_queued_requests=0), route_prefix="/wsfull")

    def first_connection() -> ClientConnection | None:
        # With no queue, a request the proxy gets before it has heard of the new replica
        # is refused, as Ray Serve's caller refuses one (seen on a loaded host): retry.
        try:
            return connect(ws_url(toolkit, "/wsfull/ws/who"))
        except InvalidStatus as refused:
            assert refused.response.status_code == 503
            return None

    with wait_for(first_connection, 30, "the proxy to know the replica") as holder:
        holder.send("x")
        holder.recv(timeout=10)  # the only slot is taken for as long as this stays open
        with connect(
            ws_url(toolkit, "/wsfull/ws/who"), additional_headers={"Origin": "http://127.0.0.1"}
        ) as browser:
            with pytest.raises(ConnectionClosed) as closed:
                browser.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        with pytest.raises(InvalidStatus) as refused, connect(ws_url(toolkit, "/wsfull/ws/who")):
            pass
        assert refused.value.response.status_code == 503
        assert refused.value.response.headers["retry-after"] == "1"


def test_oversized_messages_close_with_1009(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_ws_app(), route_prefix="/wsbig")
    with connect(ws_url(toolkit, "/wsbig/ws/echo"), max_size=None) as ws:
        ws.send("small")
        assert ws.recv(timeout=10) == "echo:small"
        ws.send("x" * (2 << 20))  # over the default 1 MiB limit
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def test_a_draining_replica_serves_websockets_to_its_deadline_then_closes_them_with_1012(
    toolkit: Toolkit,
) -> None:
    """About 3 s: the replica's 2 s grace period runs out while the client talks."""
    grace_s = 2.0
    name = toolkit.name()
    toolkit.run(basic.make_ws_app(graceful_shutdown_timeout_s=grace_s), name=name, route_prefix="/wsdrain")
    with connect(ws_url(toolkit, "/wsdrain/ws/echo")) as ws:
        ws.send("hello")
        assert ws.recv(timeout=10) == "echo:hello"
        began = time.monotonic()
        deleting = threading.Thread(target=tk.delete, args=(name,))
        deleting.start()  # the replica drains: open connections go on until its deadline
        answered: list[float] = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.send("again")
                assert ws.recv(timeout=10) == "echo:again"
                answered.append(time.monotonic() - began)
                time.sleep(0.1)  # a client that keeps talking, ten messages a second
        closed_after = time.monotonic() - began
    deleting.join(timeout=30)
    assert not deleting.is_alive()
    # Told to reconnect at the deadline, not before (the drain began after `began`; 0.1 s
    # for the clocks' rounding), and served until then.
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    assert closed_after >= grace_s - 0.1 and answered[-1] >= grace_s - 0.5


def test_an_app_still_sending_when_its_replica_drains_hears_its_client_left(
    toolkit: Toolkit, tmp_path: Path
) -> None:
    """After the drain's 1012 (at its deadline, 0.5 s in: the app still sends), what the app
    still sends is dropped (as after any end of the socket), and its receive() says the
    client left: its send does not fail."""
    outcome = tmp_path / "outcome"
    name = toolkit.name()
    toolkit.run(
        basic.make_ticker_app(outcome, graceful_shutdown_timeout_s=0.5), name=name, route_prefix="/wsticks"
    )
    with connect(ws_url(toolkit, "/wsticks/ticks")) as ws:
        assert ws.recv(timeout=10) == "tick"
        toolkit.cleanup()  # deletes the app: its replica drains
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    wait_for(outcome.exists, 10, "the app to end")
    assert outcome.read_text() == "websocket.disconnect"


def test_websocket_routes_on_an_ingress_class_get_self(toolkit: Toolkit) -> None:
    # Ray Serve's idiom: @app.websocket on a method of the @serve.ingress(app) class.
    toolkit.run(as_deployment(serve_compat.Chatter).bind(), route_prefix="/chatter")
    with connect(ws_url(toolkit, "/chatter/echo/blue")) as ws:
        ws.send("hello")
        assert ws.recv(timeout=10) == "chatter/blue:hello"
        ws.send(b"\x01\x02\x03")
        assert ws.recv(timeout=10) == b"\x03\x02\x01"
        ws.send("bye")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4002, "bye from blue")
    with connect(ws_url(toolkit, "/chatter/echo/red")) as ws:
        ws.send("once")
        assert ws.recv(timeout=10) == "chatter/red:once"
    # The client went away without a close from the app: the method saw the disconnect.
    with toolkit.client() as client:
        wait_for(lambda: client.get("/chatter/disconnects").json() == 1, 10, "the disconnect")
