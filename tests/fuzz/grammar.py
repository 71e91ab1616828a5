"""HTTP/1.1 byte streams a client might send, hostile ones among them, as hypothesis
strategies: request lines, targets, header fields with odd bytes, every way of framing a
body (and of framing it twice), chunk extensions and trailers, pipelined requests,
``Expect: 100-continue``, WebSocket handshakes, and where the stream is cut into reads.

Each request is mostly well formed, with one or two things wrong: a stream of pure noise
only ever meets the parser's first check.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from tests.fuzz.echo_app import PROXIED_PREFIX

#: The most requests one stream pipelines.
MAX_PIPELINED = 3


@dataclass(frozen=True)
class Case:
    """One connection's bytes, how they are cut into writes, and whether the client
    closes its side once it has sent them."""

    data: bytes
    #: Offsets where ``data`` is cut into separate writes (each arrives as its own read).
    splits: tuple[int, ...] = ()
    #: The client shuts its side down once everything is sent (it then only reads).
    close_early: bool = False
    #: Requests the stream was written as (a server may see fewer, or more).
    requests: int = 1

    def pieces(self) -> list[bytes]:
        edges = [0, *sorted(set(self.splits)), len(self.data)]
        return [self.data[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]

    def bytewise(self) -> Case:
        """The same bytes, one per write (h11's practice)."""
        return Case(self.data, tuple(range(1, len(self.data))), self.close_early, self.requests)


#: What can be wrong with a request; each draws none, one or two (the rest is well formed).
FLAWS = (
    "method", "target", "version", "request line", "eol", "header name", "header value",
    "separator", "obs-fold", "host", "content-length", "transfer-encoding", "both framings",
    "chunk size", "chunk extension", "chunk end", "trailer", "body length",
)  # fmt: skip

ODD_METHODS = [
    b"get",
    b"G\x00T",
    b"GE T",
    b"",
    b"POST\t",
    b"M-SEARCH",
    b"\xc3\xa9T",
    b"G" * 40,
    b"PRI",
    b"CONNECT",
]
ODD_TARGETS = [
    b"*",
    b"localhost:80",
    b"",
    b"//a",
    b"\\a",
    b"/a b",
    b"/\x7f",
    b"/a#b",
    b"a/b",
    b"/\xff",
    b"/\x00",
]
ODD_VERSIONS = [
    b"HTTP/1.2",
    b"HTTP/2.0",
    b"http/1.1",
    b"HTTP/1.1 ",
    b"HTTP/1",
    b"HTTP/0.9",
    b"",
    b"HTTP/1.1\x00",
]
ODD_EOLS = [b"\n", b"\r", b"\n\r", b"\r\r\n"]
ODD_NAMES = [
    b"X Test",
    b"X-Test ",
    b" X-Test",
    b"X\x00T",
    b"X-\xc3\xa9",
    b"",
    b"X:T",
    b"X\tT",
    b"x-\x7f",
    b"X(T)",
]
ODD_VALUES = [b"x\x00y", b"x\x7fy", b"\xc3\xa9", b"\xff", b"x\x0by", b"\x01", b"x\ry"]
ODD_SEPARATORS = [b" : ", b"::", b" :", b":\x0b"]
ODD_LENGTHS = [
    b"-1",
    b"0x10",
    b"1_0",
    b"",
    b"99999999999999999999999",
    b"+{n}",
    b" {n} ",
    b"{n}, {n}",
    b"{n}\x00",
    b"{m}",
]
ODD_CODINGS = [
    b"Chunked",
    b"chunked, chunked",
    b"gzip, chunked",
    b"chunked, gzip",
    b"identity",
    b"chunked\x0b",
    b" chunked",
    b"x",
]
ODD_SIZES = [b"{n+1}", b"{n-1}", b"g", b"ffffffffffffffffff", b"", b"+{n}", b"0x{n}", b"{n} ", b"-{n}"]

METHODS = st.sampled_from([b"GET"] * 4 + [b"POST"] * 4 + [b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH"])
SEGMENTS = st.one_of(
    st.sampled_from([b"a", b"echo", b".", b"..", b"%2e%2e", b"%2F", b"%00", b"%", b"%zz", b"%C3%A9", b""]),
    st.text(alphabet="abcXYZ019-._~!$&'()*+,;=:@", min_size=1, max_size=5).map(str.encode),
)
QUERIES = st.sampled_from([b""] * 4 + [b"?", b"?a=1", b"?a=1&a=2", b"?%00", b"?a=%zz", b"?a=b=c"])
NAMES = st.one_of(
    st.sampled_from(
        [b"X-Test", b"Accept", b"User-Agent", b"Cookie", b"x-forwarded-for", b"X-Request-ID", b"Forwarded"]
    ),
    st.text(
        alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_!#$%&'*+.^`|~",
        min_size=1,
        max_size=12,
    ).map(str.encode),
)
VALUES = st.one_of(
    st.sampled_from([b"1", b"a b", b"", b"text/plain; q=0.5", b"\tx", b"x\t"]),
    st.text(alphabet=" !\"#$%&'()*+,-./0123456789:;<=>?@ABCXYZ[]^_`abcxyz{|}~", max_size=10).map(str.encode),
)


def _sized(template: bytes, n: int) -> bytes:
    """``template`` with {n}, {n+1}, {n-1} (hexadecimal) and {m} filled in."""
    return (
        template.replace(b"{n+1}", b"%x" % (n + 1))
        .replace(b"{n-1}", b"%x" % max(n - 1, 0))
        .replace(b"{n}", b"%x" % n)
        .replace(b"{m}", b"%d" % (n + 1))
    )


@st.composite
def targets(draw: st.DrawFn, flawed: bool) -> bytes:
    if flawed:
        return draw(st.sampled_from(ODD_TARGETS))
    path = b"/" + b"/".join(draw(st.lists(SEGMENTS, min_size=0, max_size=4)))
    if draw(st.integers(0, 2)) == 0:  # the proxied path's copy of the app
        path = PROXIED_PREFIX.encode() + path
    if draw(st.integers(0, 9)) == 0:
        return b"http://localhost" + path + draw(QUERIES)
    return path + draw(QUERIES)


@st.composite
def header_lines(draw: st.DrawFn, flaws: set[str]) -> list[bytes]:
    """Ordinary header lines, with the header-shaped flaws in ``flaws``."""
    lines = []
    count = draw(st.integers(0, 3))
    for index in range(
        max(count, 1 if flaws & {"header name", "header value", "separator", "obs-fold"} else 0)
    ):
        name = draw(st.sampled_from(ODD_NAMES)) if "header name" in flaws and index == 0 else draw(NAMES)
        value = draw(st.sampled_from(ODD_VALUES)) if "header value" in flaws and index == 0 else draw(VALUES)
        sep = draw(st.sampled_from(ODD_SEPARATORS)) if "separator" in flaws and index == 0 else b": "
        line = name + sep + value
        if "obs-fold" in flaws and index == 0:  # a line that continues the one before
            line += draw(st.sampled_from([b"\r\n folded", b"\r\n\tfolded", b"\n folded"]))
        lines.append(line)
    return lines


@st.composite
def chunked_body(draw: st.DrawFn, eol: bytes, flaws: set[str]) -> bytes:
    """A chunked body: chunks (sizes as written, extensions), the last chunk, trailers."""
    out = b""
    count = draw(st.integers(1 if flaws & {"chunk size", "chunk extension"} else 0, 3))
    for index in range(count):
        data = draw(st.binary(min_size=1, max_size=12))
        size = b"%x" % len(data)
        if "chunk size" in flaws and index == 0:
            size = _sized(draw(st.sampled_from(ODD_SIZES)), len(data))
        ext = b""
        if "chunk extension" in flaws and index == 0:
            ext = draw(
                st.sampled_from([b";a=b", b"; a=b", b';a="q"', b";\x00", b";" + b"e" * 30, b";a=\x7f"])
            )
        elif draw(st.integers(0, 9)) == 0:
            ext = b";name=value"
        end = draw(st.sampled_from([b"", b"xx" + eol, b"\n", b"\r"])) if "chunk end" in flaws else eol
        out += size + ext + eol + data + end
    out += b"0" + eol
    if "trailer" in flaws:
        for _ in range(draw(st.integers(1, 2))):
            out += draw(
                st.sampled_from(
                    [b"X-T: 1", b"Content-Length: 5", b"Host: evil", b"X-Request-ID: t", b"bad trailer"]
                )
            )
            out += eol
    return out + eol


@st.composite
def framing(draw: st.DrawFn, eol: bytes, flaws: set[str]) -> tuple[list[bytes], bytes]:
    """The body's framing headers and the body as sent: none, Content-Length, chunked (or
    both, or wrong, as ``flaws`` say)."""
    data = draw(st.binary(min_size=0, max_size=16))
    chunked_flaws = {"transfer-encoding", "chunk size", "chunk extension", "chunk end", "trailer"}
    if flaws & chunked_flaws or "both framings" in flaws or draw(st.integers(0, 3)) == 0:
        coding = draw(st.sampled_from(ODD_CODINGS)) if "transfer-encoding" in flaws else b"chunked"
        headers = [b"Transfer-Encoding: " + coding]
        if "both framings" in flaws:
            headers.insert(draw(st.integers(0, 1)), b"Content-Length: %d" % draw(st.integers(0, 40)))
        return headers, draw(chunked_body(eol, flaws))
    if "content-length" in flaws:
        length = draw(st.sampled_from(ODD_LENGTHS)).replace(b"{n}", b"%d" % len(data))
        headers = [b"Content-Length: " + length.replace(b"{m}", b"%d" % (len(data) + 1))]
        if draw(st.booleans()):  # a second Content-Length, the same or not
            headers.append(
                b"Content-Length: " + draw(st.sampled_from([b"%d" % len(data), b"%d" % (len(data) + 1)]))
            )
        return headers, data
    if not data and draw(st.booleans()):
        return [], b""
    sent = data + draw(st.binary(min_size=1, max_size=4)) if "body length" in flaws else data
    return [b"Content-Length: %d" % len(data)], sent


@st.composite
def extras(draw: st.DrawFn) -> list[bytes]:
    """Connection management: Expect, Connection, a WebSocket handshake."""
    chosen = []
    if draw(st.integers(0, 7)) == 0:
        chosen.append(
            draw(st.sampled_from([b"Expect: 100-continue", b"Expect: 100-Continue", b"Expect: nonsense"]))
        )
    if draw(st.integers(0, 7)) == 0:
        chosen.append(
            draw(st.sampled_from([b"Connection: close", b"Connection: keep-alive", b"Connection: upgrade"]))
        )
    if draw(st.integers(0, 9)) == 0:
        chosen += [
            b"Upgrade: " + draw(st.sampled_from([b"websocket", b"WebSocket", b"h2c", b"websocket, x"])),
            b"Connection: Upgrade",
            b"Sec-WebSocket-Key: " + draw(st.sampled_from([b"dGhlIHNhbXBsZSBub25jZQ==", b"short", b""])),
            b"Sec-WebSocket-Version: " + draw(st.sampled_from([b"13", b"8", b""])),
        ]
    return chosen


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    flaws = set(draw(st.lists(st.sampled_from(FLAWS), max_size=2))) if draw(st.integers(0, 4)) > 1 else set()
    eol = draw(st.sampled_from(ODD_EOLS)) if "eol" in flaws else b"\r\n"
    method = draw(st.sampled_from(ODD_METHODS)) if "method" in flaws else draw(METHODS)
    version = (
        draw(st.sampled_from(ODD_VERSIONS))
        if "version" in flaws
        else draw(st.sampled_from([b"HTTP/1.1"] * 9 + [b"HTTP/1.0"]))
    )
    line = method + b" " + draw(targets("target" in flaws)) + b" " + version
    if "request line" in flaws:
        line = draw(
            st.sampled_from(
                [line + b" extra", line.replace(b" ", b"  ", 1), b" " + line, line.replace(b" ", b"\t")]
            )
        )
    hosts = [b"Host: localhost"]
    if "host" in flaws:
        hosts = draw(
            st.sampled_from(
                [[], [b"Host: localhost", b"Host: other"], [b"Host:"], [b"Host: a b"], [b"Host: \x00"]]
            )
        )
    framed, body = draw(framing(eol, flaws))
    head = [line, *hosts, *draw(header_lines(flaws)), *draw(extras()), *framed]
    return eol.join(head) + eol + eol + body


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A connection's bytes (one request or several pipelined) and how they arrive."""
    parts = draw(st.lists(requests(), min_size=1, max_size=MAX_PIPELINED))
    data = b"".join(parts)
    splits: tuple[int, ...] = ()
    if len(data) > 1 and draw(st.booleans()):
        splits = tuple(draw(st.lists(st.integers(1, len(data) - 1), min_size=1, max_size=4)))
    return Case(data, splits, draw(st.integers(0, 9)) == 0, len(parts))
