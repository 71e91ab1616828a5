"""How toolkit processes write their logs: text lines with a timestamp, or JSON lines.

One handler on the root logger of each process (driver, proxy, replicas, controller),
so user code's loggers come out the same way. Every record carries the request id and,
inside a replica, its application, deployment and replica id. Level and format reach Ray
workers through the environment (``APP_TOOLKIT_LOG_LEVEL``, ``APP_TOOLKIT_LOG_FORMAT``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Literal, TextIO

from app_toolkit._runtime import console_pipe, request_context
from app_toolkit.config import LOG_LEVEL_ENV, LoggingConfig

FORMAT_ENV = "APP_TOOLKIT_LOG_FORMAT"
LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
LEVELS = ("debug", "info", "warning", "error", "critical")

#: Fields every record gets (empty when they do not apply).
CONTEXT_FIELDS = ("request_id", "application", "deployment", "replica", "route")
_TEXT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s%(where)s: %(message)s"
_DATE = "%Y-%m-%dT%H:%M:%S"


#: The levels of deployments whose replicas share a process with others (the local
#: backend), by (application, deployment): their records below it are not written.
_floors: dict[tuple[str, str], int] = {}


class _Context(logging.Filter):
    """Adds the request and replica a record was logged for (unless given as ``extra``);
    drops a replica's record below its deployment's level."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        if not fields.get("request_id"):
            fields["request_id"] = request_context.current_request_id()
        replica = request_context.replica.get()
        if replica is not None:
            if _floors and record.levelno < _floors.get((replica.app_name, replica.deployment), 0):
                return False
            fields.setdefault("application", replica.app_name)
            fields.setdefault("deployment", replica.deployment)
            fields.setdefault("replica", replica.replica_id)
        for name in CONTEXT_FIELDS:
            fields.setdefault(name, "")
        fields["where"] = _where(fields)
        return True


def _json_line(
    created: float, level: str, name: str, message: str, fields: Mapping[str, object]
) -> dict[str, object]:
    return {
        "timestamp": _timestamp(created) + "Z",
        "level": level,
        "logger": name,
        "message": message,
        **{key: value for key, value in fields.items() if value},
    }


def _timestamp(created: float) -> str:
    """``created`` as ISO 8601 UTC with milliseconds (the second's text and the last
    millisecond's are cached: a batch of access lines shares them)."""
    global _last_second, _last_milli
    milli = int(created * 1000)
    cached = _last_milli  # read once: another thread may replace it meanwhile
    if milli == cached[0]:
        return cached[1]
    second, fraction = divmod(milli, 1000)
    day = _last_second
    if second != day[0]:
        day = _last_second = (second, time.strftime(_DATE, time.gmtime(second)))
    text = f"{day[1]}.{fraction:03d}"
    _last_milli = (milli, text)
    return text


_last_second: tuple[int, str] = (-1, "")
_last_milli: tuple[int, str] = (-1, "")


class JSONFormatter(logging.Formatter):
    """One JSON object per line: timestamp (UTC, ISO 8601), level, logger, message, the
    context fields, and the traceback if there is one."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {name: getattr(record, name, "") for name in CONTEXT_FIELDS}
        entry = _json_line(record.created, record.levelname, record.name, record.getMessage(), fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(_TEXT, _DATE)
        self.converter = time.gmtime  # timestamps in UTC, like the JSON lines


class BatchWriter:
    """Writes many records of one logger at once, formatted as the toolkit's handler
    would, in one write: for lines a process produces at a high rate (the access log).
    When this node's Ray was started by a process here (``app-toolkit run``, ``tk.run``)
    they take the short way to its console (``console_pipe``).

    Only for a logger whose records reach nothing but that handler (see :func:`batch_writer`).
    """

    def __init__(self, handler: logging.StreamHandler[TextIO], name: str, json_lines: bool) -> None:
        self._handler = handler
        self._name = name
        self._json = json_lines

    def write(self, level: str, entries: Sequence[tuple[float, str, Mapping[str, object]]]) -> None:
        """``entries``: (time.time() when it happened, message, context fields) each."""
        if self._json:
            lines = [
                json.dumps(_json_line(created, level, self._name, message, fields), ensure_ascii=False)
                for created, message, fields in entries
            ]
        else:
            lines = [
                f"{_timestamp(created)} {level} {self._name}{_where(fields)}: {message}"
                for created, message, fields in entries
            ]
        text = "\n".join(lines) + "\n"
        pipe = console_pipe.writer()
        if pipe is not None:
            text = pipe.write(text)
            if not text:
                return
        handler = self._handler
        with handler.lock or contextlib.nullcontext():
            try:
                handler.stream.write(text)
                handler.flush()
            except Exception:  # noqa: BLE001 - as logging does: a broken stream must not break serving
                handler.handleError(logging.makeLogRecord({"msg": "%d log lines", "args": (len(lines),)}))


def _where(fields: Mapping[str, object]) -> str:
    """The line's ``[replica request_id]`` part, with a leading space; either is left out
    when it is empty, the whole part when both are."""
    replica, request_id = fields.get("replica"), fields.get("request_id")
    if replica:
        return f" [{replica} {request_id}]" if request_id else f" [{replica}]"
    return f" [{request_id}]" if request_id else ""


def batch_writer(logger: logging.Logger) -> BatchWriter | None:
    """A :class:`BatchWriter` for ``logger`` when its records go only to the toolkit's
    handler (none of its own, propagated to a root with just that handler); else
    None: log record by record, so other handlers see them."""
    node: logging.Logger | None = logger
    while node is not None and node is not logging.root:
        if node.handlers or node.filters or not node.propagate:
            return None
        node = node.parent
    handlers = logging.root.handlers
    if len(handlers) != 1 or handlers[0].get_name() != "app_toolkit" or logging.root.filters:
        return None
    handler = handlers[0]
    if not isinstance(handler, logging.StreamHandler):
        return None
    if isinstance(handler.formatter, JSONFormatter):
        return BatchWriter(handler, logger.name, json_lines=True)
    if isinstance(handler.formatter, _TextFormatter):
        return BatchWriter(handler, logger.name, json_lines=False)
    return None


def configure(level: str | None = None, log_format: str | None = None) -> None:
    """Log this process the toolkit's way (arguments default to the environment's)."""
    level = level.lower() if level and level.lower() in LEVELS else _process_level()
    log_format = (log_format or os.environ.get(FORMAT_ENV) or "text").lower()
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Context())
    handler.setFormatter(JSONFormatter() if log_format == "json" else _TextFormatter())
    handler.set_name("app_toolkit")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "app_toolkit"]:
        root.removeHandler(old)
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    logging.getLogger("app_toolkit").setLevel(level.upper())


def follow_deployment(app: str, deployment: str, config: LoggingConfig | None, whole_process: bool) -> None:
    """Log a replica of ``deployment`` by its ``logging_config`` (None: the process's).

    ``whole_process``: the replica has the process to itself (on Ray), so its level is
    every logger's (the root's, the toolkit's) and its encoding the handler's; access
    lines keep the process's level (their application's ``enable_access_log`` decides).
    Otherwise only records logged in its replicas below its level are dropped (the
    process's format stays; a level below the process's lets nothing more through)."""
    if not whole_process:
        if config is None:
            _floors.pop((app, deployment), None)
        else:
            _floors[(app, deployment)] = config.level_number
        return
    if config is None:
        configure()
        logging.getLogger().setLevel(logging.INFO)  # as configure() leaves a fresh process
        logging.getLogger("app_toolkit.access").setLevel(logging.NOTSET)
        return
    configure(config.level_name(), config.encoding.lower())
    logging.getLogger().setLevel(config.level_number)
    logging.getLogger("app_toolkit.access").setLevel(_process_level().upper())


def _process_level() -> str:
    """The level the process was asked for (``APP_TOOLKIT_LOG_LEVEL``), lower-case."""
    level = (os.environ.get(LOG_LEVEL_ENV) or "info").lower()
    return level if level in LEVELS else "info"
