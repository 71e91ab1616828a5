"""The proxy's HTTP protocol joins a complete response's head and body into one write."""

from __future__ import annotations

from app_toolkit._runtime.proxy.http_guard import _JOIN_MAX, RequestLink, _Writes


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


def writes() -> tuple[Transport, _Writes, RequestLink]:
    transport = Transport()
    held = _Writes(transport)  # type: ignore[arg-type]
    return transport, held, RequestLink(held)


def test_a_held_head_leaves_with_its_body() -> None:
    transport, held, link = writes()
    link.join_head_and_body()
    held.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert transport.writes == []
    held.write(b"{}")
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    held.write(b"next")  # only the one head was held
    assert transport.writes[-1] == b"next"


def test_without_a_hold_every_write_goes_at_once() -> None:
    transport, held, _ = writes()
    held.write(b"head")
    held.write(b"body")
    assert transport.writes == [b"head", b"body"]


def test_a_large_body_is_not_copied_behind_its_head() -> None:
    transport, held, link = writes()
    link.join_head_and_body()
    held.write(b"head")
    body = b"x" * _JOIN_MAX
    held.write(body)
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
