"""Connection hand-off (direct ingress) with real sockets: the request line read without
being consumed, connections passed over Unix sockets and back, the proxy's acceptor, a
server that serves connections accepted elsewhere, and what the proxy does with the
connections of a replica that died, by the phase each was in."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest
from starlette.types import Receive, Scope, Send
from websockets.sync.client import connect

from app_toolkit._runtime.connection_table import ConnectionTable, Handed, Phase, bytes_written
from app_toolkit._runtime.direct_ingress.handoff_listener import HandoffListener
from app_toolkit._runtime.front.request_link import REQUEST_LINK, RequestLink
from app_toolkit._runtime.front.server import ProxyServer, serve
from app_toolkit._runtime.proxy.acceptor import Acceptor, request_target
from app_toolkit._runtime.proxy.handoff_sender import HandoffSender
from app_toolkit.config import HTTPOptions

pytestmark = pytest.mark.anyio

#: A client's connection and the server's end of it.
Pair = tuple[socket.socket, socket.socket]
#: What a replica's hand-off socket adopted: the connection, and its record (the proxy's copy).
Adopted = tuple[socket.socket, Handed | None]
#: The proxy's listening socket, what it served itself, what the replica got, the replica's socket.
Parts = tuple[socket.socket, list[socket.socket], list[Adopted], HandoffListener]
SLOTS = 8


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("head", "path"),
    [
        (b"GET /a/b?x=1 HTTP/1.1\r\nhost: x\r\n\r\n", "/a/b"),
        (b"POST /caf%C3%A9 HTTP/1.0\r\n", "/café"),
        (b"GET http://example.test/app/x?q HTTP/1.1\r\n", "/app/x"),
        (b"GET http://example.test HTTP/1.1\r\n", "/"),
        (b"GET / HTTP/1.1\n", "/"),  # a bare LF ends the line too
        (b"GET /a/b HTTP/1.1", None),  # the line has not ended yet
        (b"GET /a HTTP/2.0\r\n", None),
        (b"OPTIONS * HTTP/1.1\r\n", None),
        (b"\x16\x03\x01\x02\x00\n", None),  # a TLS hello, not HTTP
    ],
)
def test_the_request_line_names_the_path(head: bytes, path: str | None) -> None:
    assert request_target(head) == path


@pytest.fixture
def tcp_pair() -> Iterator[Pair]:
    """A client's connection and the server's end of it, on 127.0.0.1."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server_end, _ = listener.accept()
    listener.close()
    client.settimeout(5)
    yield client, server_end
    client.close()
    server_end.close()


async def _until(condition: object, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


class Ends:
    """A replica's hand-off socket and the proxy's sender, with what each adopted."""

    def __init__(self) -> None:
        self.at_replica: list[Adopted] = []
        self.at_proxy: list[socket.socket] = []  # served by the proxy
        self.routed: list[socket.socket] = []  # routed anew (their replica died)
        self.ready = True
        self.listener = HandoffListener(
            lambda sock, handed: self.at_replica.append((sock, handed)), self.ready_now
        )
        self.path = self.listener.start()
        self.sender = HandoffSender(self.at_proxy.append, self.routed.append, SLOTS)

    def adopt(self, sock: socket.socket, handed: Handed | None) -> None:
        self.at_replica.append((sock, handed))

    def ready_now(self) -> bool:
        return self.ready

    def close(self) -> None:
        self.sender.close()
        self.listener.close()
        for sock in [sock for sock, _ in self.at_replica] + self.at_proxy + self.routed:
            sock.close()


@pytest.fixture
async def ends() -> AsyncIterator[Ends]:
    made = Ends()
    yield made
    made.close()


def _blocking(sock: socket.socket) -> socket.socket:
    sock.settimeout(5)
    return sock


async def test_a_connection_goes_to_the_replica_and_back(tcp_pair: Pair, ends: Ends) -> None:
    client, server_end = tcp_pair
    assert ends.path.startswith("\0")  # an abstract name: no file to leave behind
    assert ends.sender.send(ends.path, server_end)  # the sender keeps this copy
    await _until(lambda: ends.at_replica)
    at_replica, handed = ends.at_replica[0]
    assert handed is not None and handed.table.phase(handed.slot) is Phase.HANDED
    client.sendall(b"ping")
    assert _blocking(at_replica).recv(4) == b"ping"
    at_replica.sendall(b"pong")
    assert client.recv(4) == b"pong"
    # Given back: the proxy serves its own copy; the client's connection stays open.
    assert ends.listener.give_back(at_replica, handed)
    at_replica.close()
    await _until(lambda: ends.at_proxy)
    assert ends.at_proxy == [server_end]
    client.sendall(b"again")
    assert _blocking(ends.at_proxy[0]).recv(5) == b"again"
    ends.listener.close()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as late, pytest.raises(ConnectionRefusedError):
        late.connect(ends.path)  # the name is gone with the listener


async def test_a_connection_the_replica_is_done_with_ends_for_the_client(tcp_pair: Pair, ends: Ends) -> None:
    client, server_end = tcp_pair
    assert ends.sender.send(ends.path, server_end)
    await _until(lambda: ends.at_replica)
    at_replica, handed = ends.at_replica[0]
    assert handed is not None
    socket.socket(fileno=os.dup(at_replica.fileno())).close()  # a copy closed: nothing ends
    client.settimeout(0.1)
    with pytest.raises(TimeoutError):
        client.recv(1)
    handed.done()  # CLOSED, then shut down: the client sees the end, the proxy lets its copy go
    at_replica.close()
    client.settimeout(5)
    assert client.recv(1) == b""
    await _until(lambda: server_end.fileno() < 0)


async def test_a_draining_replica_sends_new_connections_back(tcp_pair: Pair, ends: Ends) -> None:
    client, server_end = tcp_pair
    assert ends.sender.send(ends.path, server_end)  # connects; the peer outlives the listener
    await _until(lambda: ends.at_replica)
    ends.listener.stop_listening()
    other, other_client = socket.socketpair()
    with other_client:
        other.setblocking(False)
        assert ends.sender.send(ends.path, other)
        await _until(lambda: ends.at_proxy)
        assert ends.at_proxy == [other] and len(ends.at_replica) == 1  # the second came straight back
    assert HandoffSender(ends.at_proxy.append, ends.routed.append, SLOTS).send(ends.path, client) is False


async def test_a_replica_not_ready_sends_connections_back(tcp_pair: Pair, ends: Ends) -> None:
    _, server_end = tcp_pair
    ends.ready = False
    assert ends.sender.send(ends.path, server_end)
    await _until(lambda: ends.at_proxy)
    assert not ends.at_replica and ends.at_proxy == [server_end]
    ends.at_proxy.clear()
    ends.ready = True
    assert ends.sender.send(ends.path, server_end)
    await _until(lambda: ends.at_replica)


async def test_a_replica_that_is_gone_takes_nothing(tcp_pair: Pair, ends: Ends) -> None:
    _, server_end = tcp_pair
    assert ends.sender.send(ends.path, server_end)
    await _until(lambda: ends.at_replica)
    ends.listener.close()  # the replica's process ends: its sockets close
    await _until(lambda: not ends.sender.alive(ends.path))
    assert ends.routed == [server_end]  # nothing of a request read: routed anew
    assert ends.sender.send(ends.path, server_end) is False
    assert ends.sender.send("/nonexistent/handoff", server_end) is False


async def test_slots_bound_what_is_handed_over(ends: Ends) -> None:
    pairs = [socket.socketpair() for _ in range(SLOTS + 1)]
    for mine, _ in pairs:
        mine.setblocking(False)
    sent = [ends.sender.send(ends.path, mine) for mine, _ in pairs]
    assert sent == [True] * SLOTS + [False]  # the last one is served by the proxy
    pairs[-1][0].close()  # what the sender did not take stays ours
    for _, theirs in pairs:
        theirs.close()


def _answer(client: socket.socket) -> bytes:
    client.settimeout(5)
    data = b""
    while piece := client.recv(4096):
        data += piece
    return data


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        (Phase.HANDED, b"served anew"),
        (Phase.IDLE, b"served anew"),
        (Phase.HEAD, b"HTTP/1.1 503 Service Unavailable"),
        (Phase.RUNNING, b"HTTP/1.1 502 Bad Gateway"),
        (Phase.STARTED, b"half a respon"),
        (Phase.STARTED, b"HTTP/1.1 502 Bad Gateway"),  # killed before its first write left
        (Phase.ENDING, b"served anew"),  # its response's end is all in the kernel
        (Phase.ENDING, b"the end of a respon"),  # not all of it: cut, so closed
        (Phase.ENDING, b"HTTP/1.1 502 Bad Gateway"),  # killed before its one write: none of it
        (Phase.CLOSED, b""),
    ],
)
async def test_the_connections_of_a_replica_that_died_are_taken_back_by_phase(
    tcp_pair: Pair, ends: Ends, phase: Phase, expected: bytes
) -> None:
    client, server_end = tcp_pair
    assert ends.sender.send(ends.path, server_end)
    await _until(lambda: ends.at_replica)
    at_replica, handed = ends.at_replica[0]
    assert handed is not None
    handed.record(phase)
    if phase in (Phase.RUNNING, Phase.STARTED, Phase.ENDING):
        handed.table.set_request_id(handed.slot, "the-request-id")
    if phase is Phase.STARTED:
        handed.started(bytes_written(at_replica))
        if expected != b"HTTP/1.1 502 Bad Gateway":
            at_replica.sendall(b"half a respon")
    if phase is Phase.ENDING:  # a whole response in one write, from ``sent``
        sent = bytes_written(at_replica)
        assert sent is not None
        response = b"the end of a response"
        if expected != b"HTTP/1.1 502 Bad Gateway":
            at_replica.sendall(response if expected == b"served anew" else response[:-2])
        handed.ending(sent + len(response), sent)
    ends.listener.close()  # the replica is gone: the proxy's peer sees its end
    await _until(lambda: not ends.sender.alive(ends.path))
    if expected == b"served anew":
        assert ends.routed == [server_end]
        return
    assert not ends.routed and not ends.at_proxy
    answer = await asyncio.to_thread(_answer, client)
    assert answer.startswith(expected)
    if phase is Phase.HEAD:
        assert b"retry-after: 1" in answer and b'"request_id": "' in answer
    if expected == b"HTTP/1.1 502 Bad Gateway":
        assert b"x-request-id: the-request-id" in answer and b"may have run" in answer
        assert b"connection: close" in answer


async def test_a_response_begun_before_its_last_write_is_closed_not_answered(
    tcp_pair: Pair, ends: Ends
) -> None:
    """A stream whose head left earlier, its replica killed before its last write: none
    of that write is in the kernel, but the client has part of the response, so a 502
    after it would corrupt it: the connection is closed."""
    client, server_end = tcp_pair
    assert ends.sender.send(ends.path, server_end)
    await _until(lambda: ends.at_replica)
    at_replica, handed = ends.at_replica[0]
    assert handed is not None
    handed.table.set_request_id(handed.slot, "the-request-id")
    at_replica.sendall(b"a stream's head")
    sent = bytes_written(at_replica)
    assert sent is not None
    handed.ending(sent + len(b"its last chunk"), None)  # bytes of it were written before
    ends.listener.close()
    await _until(lambda: not ends.sender.alive(ends.path))
    assert not ends.routed and not ends.at_proxy
    assert await asyncio.to_thread(_answer, client) == b"a stream's head"


class _Routes:
    def __init__(self, target: tuple[str, str] | None) -> None:
        self.target = target
        self.paths: list[str] = []
        self.key = b""  # "": keys are off; else the X-API-Key a head must present

    def wanted(self) -> bool:
        return True

    def opens(self, head: bytes) -> bool:
        return not self.key or b"\r\nx-api-key: " + self.key + b"\r\n" in head

    def choose(self, path: str) -> tuple[str, str] | None:
        self.paths.append(path)
        return self.target


@pytest.fixture
async def acceptor_parts() -> AsyncIterator[Parts]:
    listen = socket.create_server(("127.0.0.1", 0))
    here: list[socket.socket] = []
    at_replica: list[Adopted] = []
    listener = HandoffListener(lambda sock, handed: at_replica.append((sock, handed)))
    listener.start()
    yield listen, here, at_replica, listener
    listener.close()
    for sock in here + [sock for sock, _ in at_replica]:
        sock.close()


async def test_the_acceptor_hands_off_by_the_first_request_line(
    acceptor_parts: Parts,
) -> None:
    listen, here, at_replica, listener = acceptor_parts
    routes = _Routes(("app", listener.path))
    sender = HandoffSender(here.append, here.append, SLOTS)
    acceptor = Acceptor(listen, here.append, routes, sender, wait_s=5, max_waiting=10)
    acceptor.start()
    try:
        with socket.create_connection(listen.getsockname()) as client:
            await asyncio.sleep(0.05)  # accepted; nothing sent yet: it waits
            assert not here and not at_replica
            client.sendall(b"GET /app/x HTTP/1.1\r\nhost: t\r\n\r\n")
            await _until(lambda: at_replica)
            # Nothing was consumed: the replica reads the whole request.
            assert _blocking(at_replica[0][0]).recv(100).startswith(b"GET /app/x HTTP/1.1\r\n")
        assert routes.paths == ["/app/x"] and not here
        routes.target = None  # no local replica of that app: served here
        with socket.create_connection(listen.getsockname()) as client:
            client.sendall(b"GET /other HTTP/1.1\r\n\r\n")
            await _until(lambda: here)
        with socket.create_connection(listen.getsockname()) as client:
            client.sendall(b"GET /split-req")  # no whole line in the first segment: served here
            await _until(lambda: len(here) == 2)
        # With API keys, a head that presents none is served here: it reaches no replica.
        routes.target, routes.key = ("app", listener.path), b"k"
        with socket.create_connection(listen.getsockname()) as client:
            client.sendall(b"GET /app/x HTTP/1.1\r\nhost: t\r\n\r\n")
            await _until(lambda: len(here) == 3)
        with socket.create_connection(listen.getsockname()) as client:
            client.sendall(b"GET /app/y HTTP/1.1\r\nx-api-key: k\r\n\r\n")
            await _until(lambda: len(at_replica) == 2)
        assert len(here) == 3
    finally:
        acceptor.close()
        sender.close()


async def test_the_acceptor_closes_a_connection_that_sends_nothing(
    acceptor_parts: Parts,
) -> None:
    listen, here, at_replica, listener = acceptor_parts
    sender = HandoffSender(here.append, here.append, SLOTS)
    routes = _Routes(("app", listener.path))
    acceptor = Acceptor(listen, here.append, routes, sender, wait_s=0.2, max_waiting=1)
    acceptor.start()
    try:
        with socket.create_connection(listen.getsockname()) as quiet:
            quiet.settimeout(5)
            await asyncio.sleep(0.05)
            assert not here  # it waits for its first bytes
            with socket.create_connection(listen.getsockname()):
                # One connection may wait (max_waiting): the next is served here at once.
                await _until(lambda: here)
            # After wait_s of silence the quiet one is closed, as an idle one would be.
            assert await asyncio.to_thread(quiet.recv, 1) == b""
        assert not at_replica and not routes.paths
    finally:
        acceptor.close()
        sender.close()


async def test_a_closing_acceptor_gives_its_waiting_connections_to_the_proxys_server(
    acceptor_parts: Parts,
) -> None:
    """One accepted whose first bytes have not come is served by the proxy, not closed."""
    listen, here, at_replica, listener = acceptor_parts
    sender = HandoffSender(here.append, here.append, SLOTS)
    acceptor = Acceptor(
        listen, here.append, _Routes(("app", listener.path)), sender, wait_s=5, max_waiting=10
    )
    acceptor.start()
    try:
        with socket.create_connection(listen.getsockname()) as client:
            await asyncio.sleep(0.05)
            assert not here  # it waits for its first bytes
            acceptor.close()
            assert len(here) == 1 and not at_replica
            client.sendall(b"GET /app/x HTTP/1.1\r\nhost: t\r\n\r\n")  # the acceptor reads it no more
            await asyncio.sleep(0.05)
            assert len(here) == 1 and not at_replica
    finally:
        acceptor.close()
        sender.close()


async def _hello(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "websocket":
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": "hello"})
        await receive()  # until the client closes
        return
    if scope["type"] != "http":
        return
    if scope["path"] == "/stream":  # chunked: its end leaves with its last chunk
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"hel", "more_body": True})
        await send({"type": "http.response.body", "body": b"lo"})
        return
    link: RequestLink = scope[REQUEST_LINK]  # our protocol gives every request one
    link.join_head_and_body()  # as the front's whole responses (cycle.py)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    await send({"type": "http.response.body", "body": b"hello"})
    link.release()


@pytest.fixture
async def front() -> AsyncIterator[ProxyServer]:
    server = await serve(_hello, HTTPOptions(), None)
    yield server
    await server.stop(timeout_s=5)


REQUEST = b"GET / HTTP/1.1\r\nhost: t\r\n\r\n"


def _request(client: socket.socket, request: bytes = REQUEST) -> bytes:
    client.sendall(request)
    answer = b""
    while not answer.endswith((b"hello", b"0\r\n\r\n")):  # the head and the body may come apart
        piece = client.recv(1000)
        if not piece:
            break
        answer += piece
    return answer


async def test_a_server_serves_a_connection_accepted_elsewhere_and_lets_it_go(
    front: ProxyServer, tcp_pair: Pair
) -> None:
    client, server_end = tcp_pair
    server_end.setblocking(False)
    front.adopt(server_end)
    answer = await asyncio.to_thread(_request, client)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
    await _until(lambda: front.connections())
    taken: list[socket.socket] = []

    def give(sock: socket.socket, handed: Handed | None) -> bool:
        assert handed is None  # adopted directly: nobody keeps a copy
        taken.append(socket.socket(fileno=os.dup(sock.fileno())))
        return True

    assert [connection.hand_back(give) for connection in front.connections()] == [True]
    await _until(lambda: not front.connections())
    # The client's connection was not closed: the next request reaches the new holder.
    client.sendall(b"GET /next HTTP/1.1\r\n\r\n")
    assert _blocking(taken[0]).recv(100).startswith(b"GET /next ")
    taken[0].close()


@dataclass(slots=True)
class _Peeking(Handed):
    """A handed connection's record that notes, with each phase, the client's bytes still
    unread in the socket when the phase was recorded."""

    seen: list[tuple[Phase, bytes]] = field(default_factory=list)

    def record(self, phase: Phase) -> None:
        try:
            unread = self.sock.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            unread = b""
        self.seen.append((phase, unread))
        Handed.record(self, phase)


#: Replicas run on uvloop (Ray's workers install it); the proxy and tests on asyncio's own loop.
LOOPS = pytest.mark.parametrize(
    "anyio_backend", ["asyncio", ("asyncio", {"use_uvloop": True})], ids=["asyncio", "uvloop"]
)


@pytest.fixture
def peeking(tcp_pair: Pair) -> Iterator[_Peeking]:
    """The record of the server's end of ``tcp_pair`` as a handed connection."""
    _, server_end = tcp_pair
    server_end.setblocking(False)
    table, fd = ConnectionTable.create(1)
    os.close(fd)
    peer, other_peer = socket.socketpair()
    yield _Peeking(peer, table, 0, ConnectionTable.offset(0), server_end)
    # The table stays mapped: the front records CLOSED in it when it stops.
    peer.close()
    other_peer.close()


def _on_the_loop_asked(anyio_backend: object) -> None:
    """The uvloop case must not quietly run on asyncio's loop (anyio reuses a runner)."""
    wanted = "uvloop" if isinstance(anyio_backend, tuple) else "asyncio"
    assert type(asyncio.get_running_loop()).__module__.split(".")[0] == wanted


@LOOPS
async def test_a_request_is_recorded_before_its_bytes_leave_the_socket(
    front: ProxyServer, tcp_pair: Pair, peeking: _Peeking, anyio_backend: object
) -> None:
    """A replica killed between reading a request and recording it would leave the
    connection IDLE: the proxy would serve it anew and the request, its bytes gone, would
    never be answered. So HEAD is recorded while the bytes are still in the socket."""
    _on_the_loop_asked(anyio_backend)
    client, server_end = tcp_pair
    front.adopt(server_end, peeking)
    for _ in range(2):  # and again on the kept-alive connection
        peeking.seen.clear()
        answer = await asyncio.to_thread(_request, client)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
        await _until(lambda: peeking.seen and peeking.seen[-1][0] is Phase.ENDING)
        # Its app may run once its head is whole: recorded as a response not yet begun.
        assert [phase for phase, _ in peeking.seen] == [Phase.HEAD, Phase.STARTED, Phase.ENDING]
        assert peeking.seen[0][1] == REQUEST  # nothing of it was read yet


@LOOPS
@pytest.mark.parametrize("path", ["/", "/stream"])
async def test_a_replica_killed_after_a_response_leaves_it_between_requests(
    front: ProxyServer, tcp_pair: Pair, ends: Ends, anyio_backend: object, path: str
) -> None:
    """A response's end is recorded (ENDING) before it is written (a whole response's
    with it; a stream's after its last chunk), and stays until the next request: a
    replica killed after writing it leaves the connection's next request to be served
    anew, not closed, once the kernel has all of it."""
    _on_the_loop_asked(anyio_backend)
    client, server_end = tcp_pair
    assert ends.sender.send(ends.path, server_end)
    await _until(lambda: ends.at_replica)
    at_replica, handed = ends.at_replica[0]
    assert handed is not None
    began = bytes_written(at_replica)
    front.adopt(at_replica, handed)
    request = f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode()
    answer = await asyncio.to_thread(_request, client, request)
    assert answer.startswith(b"HTTP/1.1 200")
    await _until(lambda: handed.table.phase(handed.slot) is Phase.ENDING)
    # Where the response began and ended in the connection's count of bytes written.
    table, slot = handed.table, handed.slot
    assert (table.start(slot), table.end(slot)) == (began, bytes_written(at_replica))
    ends.listener.close()  # the replica is gone: the proxy's peer sees its end
    await _until(lambda: not ends.sender.alive(ends.path))
    assert ends.routed == [server_end]


async def test_a_connection_the_proxy_did_not_take_back_records_its_next_request(
    front: ProxyServer, tcp_pair: Pair, peeking: _Peeking
) -> None:
    client, server_end = tcp_pair
    front.adopt(server_end, peeking)
    await _until(lambda: front.connections())
    [connection] = front.connections()
    connection.request_may_start()  # as a wake-up that found nothing to read: HEAD

    def refused(sock: socket.socket, handed: Handed | None) -> bool:
        assert handed is not None
        handed.record(Phase.IDLE)  # as the replica's give_back, whose send then fails
        return False

    assert connection.hand_back(refused) is False
    peeking.seen.clear()
    answer = await asyncio.to_thread(_request, client)
    assert answer.startswith(b"HTTP/1.1 200")
    assert peeking.seen[0] == (Phase.HEAD, REQUEST)


def _websocket_hello(client: socket.socket) -> str | bytes:
    with connect("ws://t/ws", sock=client, open_timeout=5, close_timeout=5) as websocket:
        return websocket.recv(timeout=5)


@LOOPS
async def test_a_websocket_upgrade_is_recorded_and_served_on_a_handed_connection(
    front: ProxyServer, tcp_pair: Pair, peeking: _Peeking, anyio_backend: object
) -> None:
    _on_the_loop_asked(anyio_backend)
    client, server_end = tcp_pair
    front.adopt(server_end, peeking)
    assert await asyncio.to_thread(_websocket_hello, client) == "hello"
    assert [phase for phase, _ in peeking.seen] == [Phase.HEAD, Phase.STARTED]
    assert peeking.seen[0][1].startswith(b"GET /ws HTTP/1.1\r\n")  # recorded before the read
    await _until(lambda: peeking.table.phase(peeking.slot) is Phase.CLOSED)  # the client closed


async def test_a_connection_in_the_middle_of_a_request_is_not_given_back(
    front: ProxyServer, tcp_pair: Pair
) -> None:
    client, server_end = tcp_pair
    server_end.setblocking(False)
    front.adopt(server_end)
    client.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n")  # the head has not ended
    await _until(lambda: front.connections())
    await asyncio.sleep(0.05)
    assert [connection.hand_back(lambda sock, handed: True) for connection in front.connections()] == [False]


async def test_no_connection_goes_to_another_process_that_took_a_freed_name(
    tcp_pair: Pair, ends: Ends
) -> None:
    _, server_end = tcp_pair
    ends.listener.close()  # the replica drains or dies: its name is free
    name = ends.path
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        # Any process may bind a freed abstract name; this one is not the replica whose
        # pid the name carries (here: the name of a process that is not us).
        pid = name.rsplit("-", 2)[1]
        taken = name.replace(f"-{pid}-", f"-{int(pid) + 1}-")
        impostor.bind(taken)
        impostor.listen(1)
        assert ends.sender.send(taken, server_end) is False
        reached, _ = impostor.accept()  # it reached the impostor, sent nothing and left
        with reached:
            reached.settimeout(5)
            assert reached.recv(1) == b""
    finally:
        impostor.close()


async def test_the_listener_hears_only_its_own_user(ends: Ends, monkeypatch: pytest.MonkeyPatch) -> None:
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)  # as if we ran as another user
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as other:
        other.connect(ends.path)
        other.setblocking(False)

        def refused() -> bool:
            try:
                return other.recv(1) == b""  # the replica closed it
            except BlockingIOError:
                return False

        await _until(refused)
    assert not ends.at_replica
