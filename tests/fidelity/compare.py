"""Send the same exchanges to two servers of one app and say where their answers differ.

An exchange is an HTTP request (:class:`Http`) or a WebSocket session (:class:`Ws`). Each
server's answer is reduced to an :class:`Answer`: named fields (status, headers, body; for
a WebSocket the handshake, messages and close) that must be equal field by field. The
headers are a multiset: names lower-cased, the order of different names ignored, the
order of one name's values kept (as HTTP gives it meaning: two ``set-cookie`` lines).
"""

from __future__ import annotations

import re
import socket as socket_module
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import uvicorn
from starlette.types import ASGIApp
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from app_toolkit._runtime.front import uvicorn_compat
from tests.waiting import wait_for

#: Response headers that differ between any two servers: when and who answered, and the
#: toolkit's request id.
IGNORED_HEADERS = frozenset({"date", "server", "x-request-id"})
#: The Host every request names, whichever port it went to: URLs an app builds from it
#: (redirects, url_for) come out the same.
HOST = "fidelity.test"


@dataclass(frozen=True)
class Http:
    """One HTTP request: ``path`` below the app's own root (no route prefix)."""

    name: str
    method: str = "GET"
    path: str = "/"
    headers: Sequence[tuple[str, str]] = ()
    body: bytes | None = None
    #: Send the body as chunks (no content-length): transfer-encoding chunked.
    chunked: bool = False


@dataclass(frozen=True)
class Ws:
    """One WebSocket session: open ``path``, then each step in turn.

    A step is ``("send", text_or_bytes)``, ``("recv", None)`` (read one message), or
    ``("close", (code, reason))`` (the client closes). After the steps the session reads
    until the server closes (unless the client closed), and reports the close frame.
    """

    name: str
    path: str
    subprotocols: Sequence[str] = ()
    headers: Sequence[tuple[str, str]] = ()
    steps: Sequence[tuple[str, object]] = ()


@dataclass(frozen=True)
class Raw:
    """Bytes written as they are on a new connection, and every byte read back until the
    server closes it (send ``connection: close``). ``{root}`` in ``data`` stands for the
    route prefix (empty for uvicorn, whose --root-path the client does not send)."""

    name: str
    data: bytes


Exchange = Http | Ws | Raw


@dataclass(frozen=True)
class Answer:
    """What one server answered to one exchange, field by field."""

    fields: dict[str, object] = field(default_factory=dict)


#: Headers whose comma-separated items come in an order of no meaning that differs per
#: process: Starlette keeps a route's methods in a set, and joins them into ``allow`` in
#: that set's order, which string hashing (random per process) decides.
UNORDERED_ITEMS = frozenset({"allow"})
#: A cookie's ``expires`` attribute. In a ``set-cookie`` value that also has ``Max-Age``, the
#: date is compared as a placeholder: Max-Age wins over Expires (RFC 6265, 5.3), and an app
#: that gives both usually takes the date from the clock (Starlette's ``delete_cookie``
#: sends "now"), so two servers answering a second apart differ there.
EXPIRES = re.compile(r"(?i)(;\s*)expires=[^;]*")


def without_clock_expiry(set_cookie: str) -> str:
    """``set_cookie`` with its Expires attribute's date as a placeholder if it has Max-Age."""
    if re.search(r"(?i);\s*max-age=", set_cookie) is None:
        return set_cookie
    return EXPIRES.sub(r"\1expires=<per max-age>", set_cookie)


def header_multiset(headers: Sequence[tuple[str, str]], ignored: frozenset[str]) -> list[tuple[str, str]]:
    """Headers with lower-case names, grouped by name (sorted), each name's values in order."""
    by_name: dict[str, list[str]] = {}
    for name, value in headers:
        name = name.lower()
        if name in UNORDERED_ITEMS:
            value = ", ".join(sorted(item.strip() for item in value.split(",")))
        if name == "set-cookie":
            value = without_clock_expiry(value)
        if name not in ignored:
            by_name.setdefault(name, []).append(value)
    return [(name, value) for name in sorted(by_name) for value in by_name[name]]


def ask_http(client: httpx.Client, base_url: str, request: Http) -> Answer:
    given = {name.lower() for name, _ in request.headers}
    headers = [
        (name.encode("latin-1"), value.encode("latin-1"))  # httpx would encode a str as ASCII
        for name, value in [*([] if "host" in given else [("host", HOST)]), *request.headers]
    ]
    content: bytes | Iterator[bytes] | None = request.body
    if request.chunked and request.body is not None:
        body = request.body
        content = iter([body[i : i + 1000] for i in range(0, len(body), 1000)])
    client.cookies.clear()  # cookies go as each request's own cookie header
    built = client.build_request(request.method, base_url + request.path, headers=headers, content=content)
    try:
        response = client.send(built, stream=True)
    except httpx.HTTPError as exc:
        return Answer({"error": type(exc).__name__})
    try:
        raw = b"".join(response.iter_raw())
        error = ""
    except httpx.HTTPError as exc:
        raw, error = b"", type(exc).__name__
    finally:
        response.close()
    answer: dict[str, object] = {
        "status": f"{response.status_code} {response.reason_phrase}",
        "http_version": response.http_version,
        "headers": header_multiset(
            [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw], IGNORED_HEADERS
        ),
        "body": without_gzip_time(raw) if response.headers.get("content-encoding") == "gzip" else raw,
    }
    if error:
        answer["error"] = error
    return Answer(answer)


def without_gzip_time(body: bytes) -> bytes:
    """A gzip stream with its header's modification time (bytes 4-7) zeroed: Starlette's
    GZipMiddleware wrote the current second there while it used ``gzip.GzipFile`` (1.0.1
    does; 1.10's zlib stream writes 0), so two servers' answers differed by when they were
    made."""
    return body[:4] + b"\0\0\0\0" + body[8:] if body[:2] == b"\x1f\x8b" else body


#: Handshake headers a server makes per connection (the accept key answers the client's
#: random key).
WS_IGNORED_HEADERS = IGNORED_HEADERS | {"sec-websocket-accept"}


def ask_ws(ws_url: str, session: Ws) -> Answer:
    fields: dict[str, object] = {}
    try:
        socket = connect(
            ws_url + session.path,
            subprotocols=[Subprotocol(name) for name in session.subprotocols] or None,
            additional_headers=list(session.headers),
            open_timeout=10,
            close_timeout=10,
            compression=None,
        )
    except InvalidStatus as exc:
        response = exc.response
        fields["handshake"] = f"refused {response.status_code} {response.reason_phrase}"
        fields["headers"] = header_multiset(list(response.headers.raw_items()), WS_IGNORED_HEADERS)
        fields["body"] = response.body
        return Answer(fields)
    with socket:
        handshake = socket.response
        assert handshake is not None
        fields["handshake"] = f"accepted {handshake.status_code} subprotocol={socket.subprotocol}"
        fields["headers"] = header_multiset(list(handshake.headers.raw_items()), WS_IGNORED_HEADERS)
        received: list[object] = []
        closed_by_client = False
        try:
            for kind, value in session.steps:
                if kind == "send":
                    assert isinstance(value, str | bytes)
                    socket.send(value)
                elif kind == "recv":
                    received.append(socket.recv(timeout=10))
                elif kind == "close":
                    assert isinstance(value, tuple)
                    code, reason = value
                    socket.close(code, reason)
                    closed_by_client = True
            if not closed_by_client:
                while True:  # until the server closes
                    received.append(socket.recv(timeout=10))
        except ConnectionClosed:
            pass
        except TimeoutError:
            received.append("<no message within 10 s>")
        fields["received"] = received
        fields["close"] = (socket.close_code, socket.close_reason)
    return Answer(fields)


@dataclass(frozen=True)
class Difference:
    """One field of one exchange that the toolkit answered otherwise than uvicorn."""

    exchange: str
    text: str

    def __str__(self) -> str:
        return self.text


def ask_raw(url: str, root: str, exchange: Raw) -> Answer:
    host, port = url.removeprefix("http://").split(":")
    answer = b""
    with socket_module.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(exchange.data.replace(b"{root}", root.encode()))
        try:
            while chunk := raw.recv(65536):
                answer += chunk
        except TimeoutError:
            answer += b"<no close within 10 s>"
    lines = answer.split(b"\r\n")
    ignored = tuple(f"{name}:".encode() for name in IGNORED_HEADERS)
    kept = b"\r\n".join(line for line in lines if not line.lower().startswith(ignored))
    return Answer({"bytes": kept})


def differences(request: Exchange, expected: Answer, actual: Answer) -> list[Difference]:
    """One per field where ``actual`` (the toolkit) differs from ``expected`` (uvicorn)."""
    lines: list[Difference] = []
    for name in sorted(set(expected.fields) | set(actual.fields)):
        want, got = expected.fields.get(name, "<missing>"), actual.fields.get(name, "<missing>")
        if want != got:
            if name == "headers" and isinstance(want, list) and isinstance(got, list):
                only_want = [h for h in want if h not in got]
                only_got = [h for h in got if h not in want]
                detail = f"uvicorn only {only_want}, toolkit only {only_got}"
                if not only_want and not only_got:
                    detail = f"same headers, other order: uvicorn {want}, toolkit {got}"
                lines.append(Difference(request.name, f"{request.name!r} headers: {detail}"))
            else:
                text = f"{request.name!r} {name}: {_contrast(want, got)}"
                lines.append(Difference(request.name, text))
    return lines


def _contrast(want: object, got: object, context: int = 100) -> str:
    """``uvicorn X, toolkit Y``; for long texts and lists, from where they first differ."""
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        index = next(i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b)
        return f"item {index}: {_contrast(want[index], got[index], context)}"
    if (
        isinstance(want, bytes | bytearray | str)
        and isinstance(got, type(want))
        and len(repr(want)) > 2 * context
    ):
        at = next(
            (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got))
        )
        start = max(0, at - context // 2)
        want_part, got_part = want[start : at + context], got[start : at + context]
        where = f"from offset {at} (of {len(want)}, {len(got)})"
        return f"{where}: uvicorn ...{want_part!r}..., toolkit ...{got_part!r}..."
    return f"uvicorn {want!r}, toolkit {got!r}"


class UvicornThread:
    """A real uvicorn serving ``app`` on 127.0.0.1 in a thread of this process, with
    ``root_path`` as ``uvicorn --root-path`` sets it (the toolkit's route prefix: the app
    sees the same scope from both servers)."""

    def __init__(self, app: ASGIApp, port: int, root_path: str) -> None:
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            root_path=root_path,
            log_level="critical",
            lifespan="on",
            # WebSockets on websockets' sans-I/O protocol, uvicorn's "auto" from 0.50 on
            # (before, "auto" is the legacy one, which websockets 14 and later deprecate and
            # 13.1 and later fail under warnings-as-errors), with the front's mend for a
            # refused handshake on uvicorn < 0.53, whose response there carries two lengths
            # no client reads (front/uvicorn_compat.py; from 0.53 uvicorn's protocol as is).
            ws=uvicorn_compat.WebSocketProtocol,
        )
        self.server = uvicorn.Server(config)
        self.url = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self.server.run, name="fidelity-uvicorn", daemon=True)

    @contextmanager
    def running(self) -> Iterator[UvicornThread]:
        """Serve until the block ends, then tell uvicorn to stop; :meth:`join` waits until
        it has (0.1-0.2 s: its loop looks at the flag every 0.1 s, then pauses 0.1 s for
        its connections)."""
        self._thread.start()
        try:
            wait_for(
                lambda: self.server.started or not self._thread.is_alive(), 30, "uvicorn to start", 0.005
            )
            assert self.server.started, "uvicorn did not start (its lifespan failed?)"
            yield self
        finally:
            self.server.should_exit = True

    def join(self) -> None:
        self._thread.join(30)
        assert not self._thread.is_alive(), "uvicorn did not stop within 30 s"

    def settle(self) -> None:
        """Wait until uvicorn has finished every request it took (its request tasks are
        done), as between two clients' requests: a connection it ends after an answer
        (uvicorn closes it, unannounced, when an exception escapes the app after the
        answer) is closed before the next exchange looks for one to reuse. The close is a
        callback on uvicorn's loop queued before the one that forgets the task."""
        wait_for(lambda: not self.server.server_state.tasks, 30, "uvicorn to finish its requests", 0.001)


def ask(
    exchanges: Sequence[Exchange], url: str, root: str, settle: Callable[[], None] = lambda: None
) -> tuple[Answer, ...]:
    """Send every exchange in turn to the server at ``url``, below ``root`` (the toolkit's
    route prefix; empty for uvicorn, whose --root-path the client does not send), on one
    client's connections, calling ``settle`` after each; its answers in the same order."""
    answers: list[Answer] = []
    with httpx.Client(timeout=30) as client:
        for exchange in exchanges:
            if isinstance(exchange, Http):
                answers.append(ask_http(client, url + root, exchange))
            elif isinstance(exchange, Ws):
                answers.append(ask_ws(url.replace("http", "ws", 1) + root, exchange))
            else:
                answers.append(ask_raw(url, root, exchange))
            settle()
    return tuple(answers)


def compare(
    exchanges: Sequence[Exchange], expected: Sequence[Answer], actual: Sequence[Answer]
) -> list[Difference]:
    """The fields where ``actual`` (the toolkit's answers) differs from ``expected``
    (uvicorn's), exchange by exchange; none when the answers agree."""
    found: list[Difference] = []
    for exchange, want, got in zip(exchanges, expected, actual, strict=True):
        found.extend(differences(exchange, want, got))
    return found
