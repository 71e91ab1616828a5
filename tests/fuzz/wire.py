"""One case over a real socket: its bytes written as the case cuts them, and what came
back read as HTTP/1.1 responses, with what became of the connection."""

from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import dataclass
from typing import Any

from tests.fuzz.grammar import Case

#: Between two writes of one case: long enough for each to arrive as a read of its own.
WRITE_GAP_S = 0.001
#: No more bytes for this long: the server has said what it will (and keeps the connection).
QUIET_S = 0.4
#: The same, for a case run again because its outcomes differed: a loaded machine (CI's
#: two cores) may take longer than QUIET_S to answer.
PATIENT_S = 3.0
#: Every response the case asked for has come: a close, if one follows, comes within this
#: (or an eighth of the wait for bytes, if longer: a patient run waits longer for it too).
CLOSE_S = 0.05
#: A case on one server never lasts longer than this: it hung.
LIMIT_S = 8.0

_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})(?: [^\r\n]*)?")


@dataclass(frozen=True)
class Response:
    status: int
    #: The request the echo app saw (its JSON answer); None for anyone else's answer.
    seen: dict[str, Any] | None


@dataclass(frozen=True)
class Outcome:
    responses: tuple[Response, ...]
    #: "closed" (by the server), "open" (kept alive), "reset", or "hung".
    fate: str
    #: What of the server's bytes was not a response ("" when everything parsed).
    garbled: bytes = b""

    @property
    def statuses(self) -> list[int]:
        return [response.status for response in self.responses]


def exchange(port: int, case: Case, quiet_s: float = QUIET_S) -> Outcome:
    """Send ``case`` to 127.0.0.1:``port`` and read the answer (done once no byte came
    for ``quiet_s``, or sooner once every request it holds was answered)."""
    started = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=LIMIT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    received = b""
    fate = ""
    try:
        for index, piece in enumerate(case.pieces()):
            if index:
                time.sleep(WRITE_GAP_S)
            try:
                sock.sendall(piece)
            except OSError:  # the server closed already: what it said is still to read
                break
        if case.close_early:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        fate, received = _read(sock, case, started, quiet_s)
    finally:
        sock.close()
    responses, rest = parse(received, final=True)
    return Outcome(tuple(responses), fate, rest)


def _read(sock: socket.socket, case: Case, started: float, quiet_s: float) -> tuple[str, bytes]:
    received = b""
    while True:
        responses, _ = parse(received, final=False)
        finals = [r for r in responses if r.status >= 200 or r.status == 101]
        answered = len(finals) >= case.requests or any(r.status == 101 for r in finals)
        left = LIMIT_S - (time.monotonic() - started)
        if left <= 0:
            return "hung", received
        sock.settimeout(min(max(CLOSE_S, quiet_s / 8) if answered else quiet_s, left))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return "open", received
        except ConnectionResetError:
            return "reset", received
        if not data:
            return "closed", received
        received += data


def parse(data: bytes, *, final: bool) -> tuple[list[Response], bytes]:
    """The responses whole in ``data``, and what is left (``final``: nothing more will
    come, so a body that runs to the close ends here, and a head whose body has not come
    answered a HEAD request)."""
    responses: list[Response] = []
    while data:
        head_end = data.find(b"\r\n\r\n")
        line = _STATUS_LINE.match(data)
        if line is None or head_end < 0:
            return responses, data
        status = int(line.group(1))
        headers = _headers(data[line.end() : head_end])
        after = data[head_end + 4 :]
        if 100 <= status < 200:
            responses.append(Response(status, None))
            data = after
            if status == 101:
                return responses, b""  # WebSocket frames follow
            continue
        try:
            body, data_left = _body(headers, after, final)
        except ValueError:  # a length or chunk size that is not a number
            return responses, data
        if body is None:
            return responses, data
        responses.append(Response(status, _seen(body)))
        data = data_left
    return responses, b""


def _headers(block: bytes) -> dict[bytes, bytes]:
    found: dict[bytes, bytes] = {}
    for line in block.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name:
            found[name.strip().lower()] = value.strip()
    return found


def _body(headers: dict[bytes, bytes], after: bytes, final: bool) -> tuple[bytes | None, bytes]:
    """The body and what follows it; None while it has not all come."""
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        body, at = b"", 0
        while True:
            eol = after.find(b"\r\n", at)
            if eol < 0:
                return None, after
            size = int(after[at:eol].split(b";")[0], 16)
            if size == 0:
                end = after.find(b"\r\n\r\n", eol)
                return (body, after[end + 4 :]) if end >= 0 else (None, after)
            if len(after) < eol + 2 + size + 2:
                return None, after
            body += after[eol + 2 : eol + 2 + size]
            at = eol + 2 + size + 2
    if b"content-length" in headers:
        length = int(headers[b"content-length"])
        if after.startswith(b"HTTP/1.") or (final and not after):
            return b"", after  # the answer to a HEAD request: no body
        if len(after) < length:
            return None, after
        return after[:length], after[length:]
    return (after, b"") if final else (None, after)


def _seen(body: bytes) -> dict[str, Any] | None:
    try:
        seen = json.loads(body)
    except ValueError:
        return None
    return seen if isinstance(seen, dict) and "method" in seen else None
