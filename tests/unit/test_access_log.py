"""The proxy's access log: lines collected per request, written in batches, the same
lines whichever way they are written."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Iterator

import pytest

from app_toolkit._runtime import log_format
from app_toolkit._runtime.front import access_log
from app_toolkit._runtime.front.access_log import AccessLog

pytestmark = pytest.mark.anyio

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}"


def scope(path: str = "/api/items/7", query: bytes = b"") -> dict[str, object]:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "query_string": query,
        "http_version": "1.1",
        "client": ("127.0.0.1", 52144),
    }


@contextlib.contextmanager
def toolkit_logging(log_format_name: str) -> Iterator[None]:
    """The root logger as in a toolkit process: the toolkit's handler alone (pytest's own
    handlers, which it adds for each test, set aside meanwhile)."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []
    log_format.configure("info", log_format_name)
    try:
        yield
    finally:
        root.handlers = saved
        logging.getLogger("app_toolkit").setLevel(logging.NOTSET)


async def test_lines_wait_for_their_batch_and_leave_in_one_write() -> None:
    with toolkit_logging("text"):
        writes = await _written_in_batches()
    assert len(writes) == 1
    lines = writes[0].splitlines()
    assert re.fullmatch(
        STAMP + r' INFO app_toolkit\.access \[5f0c2d8e\]: 127\.0\.0\.1:52144 - "GET /api/items/7 HTTP/1\.1" '
        r"200 1\.9ms 5f0c2d8e",
        lines[0],
    ), lines[0]
    assert lines[1].endswith('"GET /api/slow?q=1 HTTP/1.1" 499 303.1ms my-client-id-17')


async def _written_in_batches() -> list[str]:
    writes: list[str] = []
    log = AccessLog()
    # Only this log's writes count (a toolkit session an earlier test left running in this
    # process may flush its own access lines meanwhile).
    flushing = [False]
    flush = log.flush

    def flush_recorded() -> None:
        flushing[0] = True
        try:
            flush()
        finally:
            flushing[0] = False

    log.flush = flush_recorded  # type: ignore[method-assign]
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    stream = handler.stream
    handler.stream = type(
        "Recorder",
        (),
        {"write": lambda _, text: writes.append(text) if flushing[0] else None, "flush": lambda _: None},
    )()
    log.add(scope(), 200, 0.0019, "5f0c2d8e", "shop", "/items/{item_id}")
    log.add(scope("/api/slow", b"q=1"), 499, 0.3031, "my-client-id-17", "shop", "/slow")
    assert writes == []  # nothing on the request path
    await asyncio.sleep(access_log.FLUSH_INTERVAL_S * 2)
    handler.stream = stream
    return writes


async def test_json_batches_carry_the_route_and_request_id(capsys: pytest.CaptureFixture[str]) -> None:
    with toolkit_logging("json"):
        log = AccessLog()
        log.add(scope(), 200, 0.001, "req-1", "shop", "/items/{item_id}")
        log.flush()
    entry = json.loads(capsys.readouterr().err)
    assert re.fullmatch(STAMP + "Z", entry["timestamp"])
    assert (entry["level"], entry["logger"], entry["request_id"]) == ("INFO", "app_toolkit.access", "req-1")
    assert (entry["application"], entry["route"]) == ("shop", "/items/{item_id}")
    assert '"GET /api/items/7 HTTP/1.1" 200 1.0ms req-1' in entry["message"]


def test_the_batch_writer_stands_aside_for_other_handlers() -> None:
    with toolkit_logging("text"):
        _stands_aside()


def _stands_aside() -> None:
    assert log_format.batch_writer(access_log.access_logger) is not None
    extra = logging.NullHandler()
    access_log.access_logger.addHandler(extra)
    try:
        assert log_format.batch_writer(access_log.access_logger) is None
    finally:
        access_log.access_logger.removeHandler(extra)
    logging.getLogger().addHandler(extra)
    assert log_format.batch_writer(access_log.access_logger) is None


async def test_with_another_handler_every_line_is_a_record(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="app_toolkit.access")
    log = AccessLog()
    forged = '/x%0a127.0.0.1:1 - "GET /admin HTTP/1.1" 200'.replace("%0a", "\n")
    log.add(scope(forged), 200, 0.002, "id\nnext", "shop", "/x")
    log.flush()
    (record,) = [r for r in caplog.records if r.name == "app_toolkit.access"]
    message = record.getMessage()
    assert "\n" not in message and "/x\\x0a127.0.0.1:1 - \\x22GET /admin" in message
    assert message.endswith("id\\x0anext")
    assert (record.__dict__["application"], record.__dict__["route"]) == ("shop", "/x")
    assert record.__dict__["request_id"] == "id\\x0anext"


async def test_the_pending_lines_are_bounded(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(access_log, "MAX_PENDING", 3)
    monkeypatch.setattr(access_log, "FLUSH_LINES", 100)
    caplog.set_level(logging.INFO, logger="app_toolkit.access")
    log = AccessLog()
    for number in range(5):
        log.add(scope(), 200, 0.001, f"r{number}", "shop", "/x")
    log.flush()
    messages = [r.getMessage() for r in caplog.records if r.name == "app_toolkit.access"]
    assert messages[0] == "2 access lines were dropped: standard error is not keeping up"
    assert [m.split()[-1] for m in messages[1:]] == ["r0", "r1", "r2"]


async def test_a_full_batch_is_written_without_waiting(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(access_log, "FLUSH_LINES", 2)
    monkeypatch.setattr(access_log, "FLUSH_INTERVAL_S", 60.0)
    caplog.set_level(logging.INFO, logger="app_toolkit.access")
    log = AccessLog()
    flushes = 0
    flush = log.flush

    def counted() -> None:
        nonlocal flushes
        flushes += 1
        flush()

    log.flush = counted  # type: ignore[method-assign]
    for name in "abc":  # the third arrives while the full batch's flush is due
        log.add(scope(), 200, 0.001, name, "shop", "/x")
    await asyncio.sleep(0)
    assert len([r for r in caplog.records if r.name == "app_toolkit.access"]) == 3
    assert flushes == 1


@pytest.mark.parametrize(
    ("path", "query", "request_id", "written"),
    [
        ("/plain/ütf", b"", "abc-123", '"GET /plain/ütf HTTP/1.1" 200 2.0ms abc-123'),
        ("/q", b"a=1&b=\xe9", "r", '"GET /q?a=1&b=é HTTP/1.1" 200 2.0ms r'),
        ('/a"b\\c', b"", "i\x7fd", '"GET /a\\x22b\\x5cc HTTP/1.1" 200 2.0ms i\\x7fd'),
        ("/c1\x85", b"x=\x1b", "i\x9fd", '"GET /c1\\x85?x=\\x1b HTTP/1.1" 200 2.0ms i\\x9fd'),
    ],
)
def test_what_the_client_chose_is_escaped_only_where_it_must_be(
    path: str, query: bytes, request_id: str, written: str
) -> None:
    # Quotes, backslashes and control characters (C0, DEL, C1) become \xNN; the rest of
    # the text (non-ASCII letters included) is written as it came.
    entry = (0.0, ("127.0.0.1", 1), "GET", path, query, "1.1", 200, 2.0, request_id, "app", "/r")
    _, message, fields = access_log._line(entry)
    assert message == f"127.0.0.1:1 - {written}"
    assert fields["request_id"] == written.rsplit(" ", 1)[1]
