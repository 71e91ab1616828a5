"""The framed channel over real loopback sockets."""

from __future__ import annotations

import asyncio
import socket

import pytest

from app_toolkit._runtime.channel import handshake
from app_toolkit._runtime.channel import server as server_module
from app_toolkit._runtime.channel.client import ChannelClient
from app_toolkit._runtime.channel.flow import FRAME_COST, STREAM_WINDOW
from app_toolkit._runtime.channel.frames import HEADER, Kind, encode_request, plain_dumps
from app_toolkit._runtime.channel.server import ResponseSink, _Connections, _ServerConnection, start_server
from app_toolkit._runtime.messages import (
    BUSY,
    DRAINING,
    END,
    BodyChunk,
    CallFailure,
    CallResult,
    HTTPRequest,
    HTTPResponse,
    HTTPResponseStart,
    MethodCall,
    Rejected,
    ReplicaLost,
    Request,
    RequestBodyPiece,
    StreamEnd,
    StreamItem,
    WebSocketMessage,
    WebSocketOpen,
)
from app_toolkit.exceptions import ReplicaUnavailableError
from tests.waiting import wait_for_async

pytestmark = pytest.mark.anyio

TOKEN = b"0123456789abcdef"


class Handler:
    def __init__(self, capacity: int = 100) -> None:
        self.capacity = capacity
        self.running = 0
        self.hanging = asyncio.Event()  # a "hang" request reached the handler
        self.cancelled = asyncio.Event()
        self.draining = False

    def admit(self, beyond_limit: bool = False) -> Rejected | None:
        if self.draining:
            return DRAINING
        if self.running >= self.capacity:
            return BUSY
        self.running += 1
        return None

    async def serve(self, message: Request, sink: ResponseSink) -> None:
        assert isinstance(message, HTTPRequest)
        try:
            if message.body == b"stream":
                sink.send(HTTPResponseStart(200, []))
                for chunk in (b"a", b"b" * 200_000, b"c"):
                    sink.send(BodyChunk(chunk))
                    await sink.drain()
                sink.send(END)
            elif message.body == b"hang":
                self.hanging.set()
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    self.cancelled.set()
                    raise
            else:
                sink.send(HTTPResponse(200, [(b"k", b"v")], message.body))
        finally:
            self.running -= 1

    def unserved(self) -> None:
        self.running -= 1


def request(body: bytes) -> HTTPRequest:
    return HTTPRequest("rid", {"type": "http", "path": "/"}, body)


async def serve(handler: Handler) -> tuple[asyncio.Server, ChannelClient]:
    server, port = await start_server(handler, "127.0.0.1", TOKEN)
    return server, ChannelClient("127.0.0.1", port, TOKEN)


async def test_unary_requests_are_multiplexed_on_one_connection() -> None:
    server, client = await serve(Handler())
    try:
        bodies = [b"x" * n for n in (0, 10, 70_000, 2_000_000)]
        exchanges = [await client.open(request(body)) for body in bodies]
        for body, exchange in zip(bodies, exchanges, strict=True):
            response = await exchange.recv()
            assert isinstance(response, HTTPResponse) and response.body == body
            assert exchange.finished
    finally:
        client.close()
        server.close()


async def test_streamed_response_arrives_in_order() -> None:
    server, client = await serve(Handler())
    try:
        exchange = await client.open(request(b"stream"))
        answers = [await exchange.recv() for _ in range(5)]
        assert [type(answer) for answer in answers] == [
            HTTPResponseStart,
            BodyChunk,
            BodyChunk,
            BodyChunk,
            StreamEnd,
        ]
        chunks = [answer.data for answer in answers if isinstance(answer, BodyChunk)]
        assert b"".join(chunks) == b"a" + b"b" * 200_000 + b"c"
    finally:
        client.close()
        server.close()


async def test_cancel_reaches_the_server_task() -> None:
    handler = Handler()
    server, client = await serve(handler)
    try:
        exchange = await client.open(request(b"hang"))
        await asyncio.wait_for(handler.hanging.wait(), 5)
        exchange.cancel()
        await asyncio.wait_for(handler.cancelled.wait(), 5)
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("how", ["cancel frame", "connection lost"])
async def test_a_request_cancelled_before_it_started_gives_its_slot_back(how: str) -> None:
    """Its cancel arrives with it (one read): its task is cancelled before it ran, so
    ``serve``'s own ``finally`` never runs; the slot comes back all the same (found by the
    fuzzer: a proxied replica's slots leaked one by one)."""
    handler = Handler()
    connection = _ServerConnection(handler, TOKEN, plain_dumps, _Connections())
    connection.authenticated = True
    kind, parts = encode_request(request(b"hang"), plain_dumps)
    for number in range(1, 4):
        connection.on_frame(kind, number, memoryview(b"".join(parts)))
    assert handler.running == 3
    if how == "cancel frame":
        for number in range(1, 4):
            connection.on_frame(Kind.CANCEL, number, memoryview(b""))
    else:
        connection.on_lost()
    await wait_for_async(lambda: handler.running == 0 and not connection.tasks, 5, "every slot given back")
    assert not handler.hanging.is_set()  # none of them ran


async def test_a_refusal_says_whether_the_server_is_full_or_draining() -> None:
    handler = Handler(capacity=0)
    server, client = await serve(handler)
    try:
        exchange = await client.open(request(b"x"))
        assert await exchange.recv() == BUSY  # full: try again soon
        handler.draining = True
        exchange = await client.open(request(b"x"))
        assert await exchange.recv() == DRAINING  # going away: send no more
    finally:
        client.close()
        server.close()


async def test_wrong_token_is_refused() -> None:
    server, port = await start_server(Handler(), "127.0.0.1", TOKEN)
    client = ChannelClient("127.0.0.1", port, b"wrong-token-0000")
    try:
        with pytest.raises(ReplicaUnavailableError, match="did not prove"):
            await asyncio.wait_for(client.open(request(b"x")), 5)
    finally:
        client.close()
        server.close()


async def test_connection_loss_ends_pending_requests() -> None:
    handler = Handler()
    server, client = await serve(handler)
    exchange = await client.open(request(b"hang"))
    await asyncio.wait_for(handler.hanging.wait(), 5)
    # The connection drops (replica process killed): the caller is told, not left hanging.
    client._conn.transport.abort()  # type: ignore[union-attr]
    assert isinstance(await asyncio.wait_for(exchange.recv(), 5), ReplicaLost)
    client.close()
    server.close()


class RecordingHandler(Handler):
    """Keeps the server's end of each connection a request arrived on."""

    def __init__(self) -> None:
        super().__init__()
        self.connections: list[_ServerConnection] = []
        self.served = 0

    async def serve(self, message: Request, sink: ResponseSink) -> None:
        self.connections.append(sink._conn)  # type: ignore[attr-defined]
        self.served += 1
        await super().serve(message, sink)


async def test_a_request_to_a_replica_that_just_died_is_not_sent_and_says_so() -> None:
    """The replica's process is gone (its end closed) but this loop has not read that yet:
    the request must fail as not sent, which the caller retries elsewhere, not come back
    as lost, which it must not (found in CI: a handle's call after a replica was killed)."""
    handler = RecordingHandler()
    server, client = await serve(handler)
    try:
        first = await client.open(request(b"x"))
        assert isinstance(await first.recv(), HTTPResponse)
        sock = handler.connections[0].transport.get_extra_info("socket")  # type: ignore[union-attr]
        sock.shutdown(socket.SHUT_RDWR)  # the replica's end closes; no await before open()
        with pytest.raises(ReplicaUnavailableError, match="nothing was sent"):
            await client.open(request(b"x"))
        assert handler.served == 1
    finally:
        client.close()
        server.close()


async def test_unreachable_replica_raises() -> None:
    server, port = await start_server(Handler(), "127.0.0.1", TOKEN)
    server.close()
    await server.wait_closed()
    client = ChannelClient("127.0.0.1", port, TOKEN)
    with pytest.raises(ReplicaUnavailableError, match="Cannot reach replica"):
        await client.open(request(b"x"))


class RecordingTransport:
    """Collects what a FrameProtocol writes, one entry per socket write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: list[bytes]) -> None:
        self.writes.append(b"".join(parts))


async def test_stream_chunks_close_together_share_a_write_and_a_pause_flushes_at_once() -> None:
    import time

    from app_toolkit._runtime.channel.frames import HEADER, FrameProtocol

    protocol = FrameProtocol()
    transport = RecordingTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]

    def frames(data: bytes) -> list[bytes]:
        found = []
        while data:
            length, _number, _kind = HEADER.unpack_from(data)
            found.append(data[HEADER.size : HEADER.size + length])
            data = data[HEADER.size + length :]
        return found

    protocol.send(Kind.BODY, 1, [b"first"], soon=True)  # nothing written lately: at once
    assert [frames(w) for w in transport.writes] == [[b"first"]]
    for chunk in (b"2", b"3", b"4"):
        protocol.send(Kind.BODY, 1, [chunk], soon=True)
    assert len(transport.writes) == 1  # waiting for the end of this loop turn
    await asyncio.sleep(0)
    assert [frames(w) for w in transport.writes] == [[b"first"], [b"2", b"3", b"4"]]

    protocol.send(Kind.BODY, 1, [b"5"], soon=True)  # right after a write: it waits ...
    time.sleep(0.005)  # ... and the app blocks its loop; the next chunk flushes both
    protocol.send(Kind.BODY, 1, [b"6"], soon=True)
    assert frames(transport.writes[-1]) == [b"5", b"6"]

    protocol.send(Kind.BODY, 1, [b"7"], soon=True)
    protocol.send(Kind.END, 1, [])  # an ordinary frame never overtakes a waiting chunk
    assert frames(transport.writes[-1]) == [b"7", b""]


async def test_a_peer_announcing_a_huge_frame_before_hello_is_cut_off_at_once() -> None:
    server, port = await start_server(Handler(), "127.0.0.1", TOKEN)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(HEADER.pack((4 << 30) - 1, 1, Kind.HELLO) + b"x" * 65536)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(1), 5) == b""  # closed, nothing buffered
    finally:
        writer.close()
        server.close()


async def test_a_peer_that_never_says_hello_is_closed_after_the_handshake_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handshake, "HANDSHAKE_TIMEOUT_S", 0.2)
    server, port = await start_server(Handler(), "127.0.0.1", TOKEN)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"\x00")  # one byte of a header, then silence (slowloris)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(1), 5) == b""
    finally:
        writer.close()
        server.close()


async def test_connections_beyond_the_cap_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "MAX_CONNECTIONS", 2)
    server, port = await start_server(Handler(), "127.0.0.1", TOKEN)
    opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    try:
        third_reader = opened[2][0]
        assert await asyncio.wait_for(third_reader.read(1), 5) == b""
        client = ChannelClient("127.0.0.1", port, TOKEN)  # a slot frees when one closes
        opened[0][1].close()
        await asyncio.sleep(0.1)
        exchange = await client.open(request(b"ok"))
        assert isinstance(await asyncio.wait_for(exchange.recv(), 5), HTTPResponse)
        client.close()
    finally:
        for _, writer in opened:
            writer.close()
        server.close()


class Tap:
    """A TCP relay on 127.0.0.1 that records every byte each way (a sniffer on the wire)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.upstream = bytearray()  # caller -> replica
        self.downstream = bytearray()  # replica -> caller
        self.server: asyncio.Server | None = None
        self.port = 0
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_writer]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, log: bytearray) -> None:
            while data := await src.read(65536):
                log += data
                dst.write(data)
                await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer, self.upstream), pump(up_reader, writer, self.downstream))

    async def close(self) -> None:
        for writer in self._writers:
            writer.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_the_token_never_crosses_the_wire_and_a_replayed_handshake_is_refused() -> None:
    server, port = await start_server(Handler(), "127.0.0.1", TOKEN)
    tap = Tap(port)
    await tap.start()
    client = ChannelClient("127.0.0.1", tap.port, TOKEN)
    try:
        exchange = await client.open(request(b"ok"))
        assert isinstance(await asyncio.wait_for(exchange.recv(), 5), HTTPResponse)
        assert TOKEN not in tap.upstream and TOKEN not in tap.downstream
        # Whoever sniffed that connection replays the caller's bytes on a new one.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(bytes(tap.upstream))
        await writer.drain()
        answered = await asyncio.wait_for(reader.read(), 5)  # until the replica closes
        writer.close()
        assert Kind.RESPONSE not in [kind for _, _, kind in _frame_heads(answered)]
    finally:
        client.close()
        await tap.close()
        server.close()


def _frame_heads(data: bytes) -> list[tuple[int, int, int]]:
    heads = []
    while len(data) >= HEADER.size:
        length, number, kind = HEADER.unpack_from(data)
        heads.append((length, number, kind))
        data = data[HEADER.size + length :]
    return heads


async def test_a_process_on_a_dead_replicas_port_cannot_pose_as_the_replica(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handshake, "HANDSHAKE_TIMEOUT_S", 0.5)
    received = bytearray()

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Knows the protocol but not the token: answers a challenge with a made-up proof.
        received.extend(await reader.read(65536))
        payload = b"n" * 16 + b"p" * 32
        writer.write(HEADER.pack(len(payload), 0, Kind.CHALLENGE) + payload)
        await writer.drain()
        while data := await reader.read(65536):
            received.extend(data)
        writer.close()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            received.extend(data)
        writer.close()

    for behaviour in (impostor, silent):
        fake = await asyncio.start_server(behaviour, "127.0.0.1", 0)
        client = ChannelClient("127.0.0.1", fake.sockets[0].getsockname()[1], TOKEN)
        with pytest.raises(ReplicaUnavailableError, match="did not prove"):
            await asyncio.wait_for(client.open(request(b"secret request")), 5)
        client.close()
        fake.close()
        await fake.wait_closed()  # after the fake has read everything the client sent
    assert TOKEN not in received and b"secret request" not in received


async def test_a_caller_with_a_bad_proof_is_cut_off() -> None:
    server, port = await start_server(Handler(), "127.0.0.1", TOKEN)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(HEADER.pack(16, 0, Kind.HELLO) + b"c" * 16)
        head = await asyncio.wait_for(reader.readexactly(HEADER.size), 5)
        length, _, kind = HEADER.unpack(head)
        assert kind == Kind.CHALLENGE
        await reader.readexactly(length)
        writer.write(HEADER.pack(32, 0, Kind.PROOF) + b"x" * 32)
        writer.write(HEADER.pack(0, 1, Kind.CALL))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(1), 5) == b""
    finally:
        writer.close()
        server.close()


class Caller:
    """Serves handle calls: "slow" answers after a while, anything else at once."""

    draining = False

    def admit(self, beyond_limit: bool = False) -> Rejected | None:
        return None

    def unserved(self) -> None:
        pass  # admit counts nothing

    async def serve(self, message: Request, sink: ResponseSink) -> None:
        assert isinstance(message, MethodCall)
        if message.method == "slow":
            await asyncio.sleep(0.2)
        if message.method == "stream":
            for item in ("one", "bad", "never"):
                sink.send(StreamItem(item))
                await asyncio.sleep(0.05)
            sink.send(END)
            return
        sink.send(CallResult(message.method))


def call(method: str) -> MethodCall:
    return MethodCall("rid", method, ())


def garbling_dumps(value: object) -> bytes:
    """Pickles ``"bad"`` (a result, or a call of that name) into bytes the other side
    cannot load."""
    bad = value == "bad" or (isinstance(value, MethodCall) and value.method == "bad")
    return b"\x80\x05not a pickle" if bad else plain_dumps(value)


def failure_text(answer: object) -> str:
    assert isinstance(answer, CallFailure)
    return answer.message


async def test_a_reply_the_caller_cannot_decode_fails_only_its_own_call() -> None:
    server, port = await start_server(Caller(), "127.0.0.1", TOKEN, garbling_dumps)
    client = ChannelClient("127.0.0.1", port, TOKEN)
    try:
        slow = await client.open(call("slow"))
        bad = await client.open(call("bad"))
        assert "could not be decoded" in failure_text(await asyncio.wait_for(bad.recv(), 5))
        stream = await client.open(call("stream"))
        assert await asyncio.wait_for(stream.recv(), 5) == StreamItem("one")
        assert "could not be decoded" in failure_text(await asyncio.wait_for(stream.recv(), 5))
        assert await asyncio.wait_for(slow.recv(), 5) == CallResult("slow")
        after = await client.open(call("after"))  # the same connection still works
        assert await asyncio.wait_for(after.recv(), 5) == CallResult("after")
        assert client._conn is not None and not client._conn.closed
    finally:
        client.close()
        server.close()


async def test_a_request_the_replica_cannot_decode_fails_only_that_call() -> None:
    server, port = await start_server(Caller(), "127.0.0.1", TOKEN)
    client = ChannelClient("127.0.0.1", port, TOKEN, garbling_dumps)
    try:
        slow = await client.open(call("slow"))
        bad = await client.open(call("bad"))
        assert "could not decode the request" in failure_text(await asyncio.wait_for(bad.recv(), 5))
        assert await asyncio.wait_for(slow.recv(), 5) == CallResult("slow")
    finally:
        client.close()
        server.close()


class Firehose:
    """Streams 64 KiB chunks as fast as the channel lets it, counting what it sent; on a
    WebSocket, counts what the app has read."""

    draining = False

    def __init__(self) -> None:
        self.sent = 0
        self.read = 0

    def admit(self, beyond_limit: bool = False) -> Rejected | None:
        return None

    def unserved(self) -> None:
        pass  # admit counts nothing

    async def serve(self, message: Request, sink: ResponseSink) -> None:
        if isinstance(message, WebSocketOpen):
            assert sink.inbound is not None
            await asyncio.sleep(0.3)  # the app is busy: messages pile up
            while True:
                await sink.inbound.get()
                self.read += 1
        sink.send(HTTPResponseStart(200, []))
        for _ in range(16 * 1024):  # 1 GiB
            sink.send(BodyChunk(b"x" * 65536))
            self.sent += 65536
            await sink.drain()
        sink.send(END)


async def test_a_slow_reader_holds_back_a_fast_stream_at_the_window() -> None:
    firehose = Firehose()
    server, port = await start_server(firehose, "127.0.0.1", TOKEN)
    client = ChannelClient("127.0.0.1", port, TOKEN)
    try:
        exchange = await client.open(request(b""))
        assert isinstance(await asyncio.wait_for(exchange.recv(), 5), HTTPResponseStart)
        await asyncio.sleep(0.5)  # nobody reads
        window = STREAM_WINDOW + 65536 + FRAME_COST
        assert exchange.inflow.outstanding <= window  # what waits in the caller
        assert firehose.sent <= 2 * window + (4 << 20)  # plus what sits in the socket buffers
        for _ in range(100):  # reading lets it go on, in order
            assert await asyncio.wait_for(exchange.recv(), 5) == BodyChunk(b"x" * 65536)
        await asyncio.sleep(0.2)
        assert firehose.sent > 100 * 65536
        assert exchange.inflow.outstanding <= window
    finally:
        client.close()
        server.close()


async def test_websocket_messages_to_a_busy_app_wait_at_the_window() -> None:
    firehose = Firehose()
    server, port = await start_server(firehose, "127.0.0.1", TOKEN)
    client = ChannelClient("127.0.0.1", port, TOKEN)
    try:
        exchange = await client.open(WebSocketOpen("rid", {"type": "websocket", "path": "/"}))
        sent = 0

        async def send_all() -> None:
            nonlocal sent
            for _ in range(200):  # 200 x 64 KiB = 12.5 MiB, far beyond the window
                await exchange.room_to_send()
                exchange.send(WebSocketMessage({"type": "websocket.receive", "bytes": b"y" * 65536}))
                sent += 1

        sender = asyncio.ensure_future(send_all())
        await asyncio.sleep(0.2)  # the app reads nothing yet
        assert not sender.done() and sent * 65536 <= STREAM_WINDOW + 65536 + FRAME_COST
        await asyncio.wait_for(sender, 10)  # once it reads, the rest flows
        assert firehose.read > 150
    finally:
        client.close()
        server.close()


class BodyReader(Handler):
    """Reads a streamed request body from ``sink.inbound`` and answers with it."""

    async def serve(self, message: Request, sink: ResponseSink) -> None:
        assert isinstance(message, HTTPRequest) and message.more_body and sink.inbound is not None
        try:
            pieces = [message.body]
            while True:
                piece = await sink.inbound.get()
                pieces.append(piece["body"])
                if not piece["more_body"]:
                    break
            sink.send(HTTPResponse(200, [], b"|".join(pieces)))
        finally:
            self.running -= 1


async def test_a_streamed_request_body_follows_the_replicas_admission() -> None:
    handler = BodyReader(capacity=1)
    server, port = await start_server(handler, "127.0.0.1", TOKEN)
    client = ChannelClient("127.0.0.1", port, TOKEN)
    streamed = HTTPRequest("rid", {"type": "http", "path": "/"}, b"start", more_body=True)
    try:
        exchange = await client.open(streamed)
        await asyncio.wait_for(exchange.room_to_send(), 5)  # the replica's first credit
        assert not exchange.finished
        refused = await client.open(streamed)  # the replica is full: no credit, a refusal
        await asyncio.wait_for(refused.room_to_send(), 5)
        assert refused.finished and await refused.recv() == BUSY
        for data, more in ((b"x" * 300_000, True), (b"end", False)):
            await asyncio.wait_for(exchange.room_to_send(), 5)
            exchange.send(RequestBodyPiece(data, more))
        answer = await asyncio.wait_for(exchange.recv(), 5)
        assert isinstance(answer, HTTPResponse) and answer.body == b"start|" + b"x" * 300_000 + b"|end"
    finally:
        client.close()
        server.close()
