"""The proxy's access log: one line per HTTP request, written off the request path.

A request only appends a tuple to a bounded list; every ``FLUSH_INTERVAL_S`` (or once
``FLUSH_LINES`` wait) the lines are formatted and written in one go. When the process logs
the toolkit's way (``log_format.batch_writer``), that is one write to standard error per
batch instead of a record, a handler call and a flushed write per request; otherwise each
line becomes an ordinary record of the ``app_toolkit.access`` logger, so handlers the
user added (or pytest's ``caplog``) see every one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.types import Scope

from app_toolkit._runtime import log_format

access_logger = logging.getLogger("app_toolkit.access")

#: Lines waiting to be written; beyond this, lines are counted and dropped (a stalled
#: standard error must not grow the proxy's memory without end).
MAX_PENDING = 20_000
FLUSH_LINES = 1_000
FLUSH_INTERVAL_S = 0.1

#: Control characters (a decoded %0a could forge a log line), quotes and backslashes are
#: written as \xNN in the access log.
_UNSAFE = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x22, 0x5C, *range(0x7F, 0xA0))}

#: One request: (time.time() at its end, client, method, path, query string, HTTP
#: version, status, duration in ms, request id, application, route template).
_Entry = tuple[float, Any, str, str, bytes, str, int, float, str, str, str]


class AccessLog:
    """Collects the proxy's access lines and writes them in batches."""

    def __init__(self) -> None:
        self._pending: list[_Entry] = []
        self._timer: asyncio.Handle | None = None  # the flush that is due
        self._full = False  # that flush is the one for a full batch (at once)
        self.dropped = 0

    def add(
        self, scope: Scope, status: int, duration_s: float, request_id: str, app: str, route: str
    ) -> None:
        """Note one finished request (cheap: the line is made later)."""
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self._pending.append(
            (
                time.time(),
                scope.get("client"),
                scope["method"],
                scope["path"],
                scope.get("query_string", b""),
                scope.get("http_version", "1.1"),
                status,
                duration_s * 1000,
                request_id,
                app,
                route,
            )
        )
        if len(self._pending) >= FLUSH_LINES:
            if not self._full:
                self._cancel_timer()
                self._timer = asyncio.get_running_loop().call_soon(self.flush)
                self._full = True
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self.flush)

    def flush(self) -> None:
        """Write every waiting line now (also when the proxy stops)."""
        self._cancel_timer()
        entries, self._pending = self._pending, []
        dropped, self.dropped = self.dropped, 0
        if dropped:
            access_logger.warning("%d access lines were dropped: standard error is not keeping up", dropped)
        if not entries or not access_logger.isEnabledFor(logging.INFO):
            return
        writer = log_format.batch_writer(access_logger)
        if writer is not None:
            writer.write("INFO", [_line(entry) for entry in entries])
            return
        for entry in entries:
            created, message, fields = _line(entry)
            record = access_logger.makeRecord(access_logger.name, logging.INFO, "", 0, message, (), None)
            record.created = created
            record.msecs = (created - int(created)) * 1000
            record.__dict__.update(fields)
            access_logger.handle(record)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._full = False


def _line(entry: _Entry) -> tuple[float, str, dict[str, str]]:
    """uvicorn's layout plus the duration and request id; 499 = the client left. What the
    client chose is escaped, so one request is always one line."""
    created, client, method, path, query, version, status, duration_ms, request_id, app, route = entry
    where = f"{client[0]}:{client[1]}" if client else "-"
    target = _escaped(f"{path}?{query.decode('latin-1')}" if query else path)
    request_id = _escaped(request_id)
    message = f'{where} - "{method} {target} HTTP/{version}" {status} {duration_ms:.1f}ms {request_id}'
    return created, message, {"request_id": request_id, "application": app, "route": route}


def _escaped(text: str) -> str:
    # Most text has nothing to escape, and these tests (in C) are cheaper than translate():
    # what isprintable() passes holds no control character (C0, DEL, C1).
    if text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return text.translate(_UNSAFE)
