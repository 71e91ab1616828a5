"""The proxy's HTTP protocol joins a complete response's head and body into one write, and
writes a response's end when the response is complete (a handed-off connection records
it first)."""

from __future__ import annotations

import os
import socket

from app_toolkit._runtime.connection_table import ConnectionTable, Handed, Phase
from app_toolkit._runtime.front.request_link import JOIN_MAX, ConnectionLink, Writes


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def writes() -> tuple[Transport, Writes, ConnectionLink]:
    transport = Transport()
    held = Writes(transport)  # type: ignore[arg-type]
    return transport, held, ConnectionLink(held)


def test_a_held_head_leaves_with_its_body() -> None:
    transport, held, link = writes()
    link.join_head_and_body()
    held.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert transport.writes == []
    held.write(b"{}")
    assert transport.writes == []  # until the response is complete (uvicorn's next call)
    held.release()
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    held.write(b"next")  # only the one head was held
    assert transport.writes[-1] == b"next"


def test_a_write_after_a_held_body_releases_them_first() -> None:
    transport, held, link = writes()
    link.join_head_and_body()
    for data in (b"head", b"body", b"more"):
        held.write(data)
    assert transport.writes == [b"headbody", b"more"]


def test_without_a_hold_every_write_goes_at_once() -> None:
    transport, held, _ = writes()
    held.write(b"head")
    held.write(b"body")
    assert transport.writes == [b"head", b"body"]


def test_a_large_body_is_not_copied_behind_its_head() -> None:
    transport, held, link = writes()
    link.join_head_and_body()
    held.write(b"head")
    body = b"x" * JOIN_MAX
    held.write(body)
    held.release()
    assert transport.writes == [b"head", body]


def test_a_head_without_a_body_is_released() -> None:
    # A HEAD request: uvicorn writes no body; the response's end (or a failure) releases.
    transport, held, link = writes()
    link.join_head_and_body()
    held.write(b"head")
    link.release()
    assert transport.writes == [b"head"]
    link.release()
    held.write(b"later")
    assert transport.writes == [b"head", b"later"]


def test_closing_writes_what_is_held_first() -> None:
    transport, held, link = writes()
    link.join_head_and_body()
    held.write(b"head")
    held.close()
    assert transport.writes == [b"head"] and transport.closed and held.is_closing()


def test_nothing_is_written_once_the_connection_closes_under_a_response() -> None:
    """The parser answered 400 to bytes that followed a request and closed the connection
    while that request's response was on its way: none of it follows the 400 (uvloop's
    transport raises on such a write; found by tests/fuzz/)."""
    transport, held, link = writes()
    link.join_head_and_body()
    held.write(b"head")
    transport.close()
    held.write(b"body")
    held.release()
    held.write(b"more")
    assert transport.writes == []


class Recording(Transport):
    """A transport that notes the connection's phase at each write."""

    def __init__(self, table: ConnectionTable) -> None:
        super().__init__()
        self.table = table
        self.phases: list[Phase] = []

    def write(self, data: bytes) -> None:
        self.phases.append(self.table.phase(0))
        super().write(data)


def test_the_end_of_a_handed_response_is_recorded_before_it_is_written() -> None:
    """A replica killed after writing a response's end but before recording IDLE must
    not leave STARTED (the proxy would close a connection that is between requests): the
    end is recorded first, with the count of bytes written that makes it whole."""
    table, fd = ConnectionTable.create(1)
    os.close(fd)
    peer, other = socket.socketpair()
    handed = Handed(peer, table, 0, ConnectionTable.offset(0), peer)
    transport = Recording(table)
    held = Writes(transport, sent=100)  # type: ignore[arg-type]
    held.starting = handed
    held.write(b"head")  # a stream's head: the response has started
    held.gathered = []
    held.write(b"last chunk")
    assert transport.writes == [b"head"]
    held.release(handed)  # complete: what was held ends it
    assert transport.writes == [b"head", b"last chunk"]
    assert transport.phases == [Phase.STARTED, Phase.ENDING]
    assert table.end(0) == 100 + len(b"headlast chunk")
    assert table.start(0) == 100  # where it began: none of it in the kernel is a 502
    held.starting = handed  # the next request: a whole response, held, in one write
    held.hold = True
    held.write(b"head")
    held.write(b"body")
    held.release(handed)
    assert table.start(0) == 100 + len(b"headlast chunk")  # nothing of it out before this write
    assert table.end(0) == 100 + len(b"headlast chunkheadbody")
    peer.close()
    other.close()
    table.close()
