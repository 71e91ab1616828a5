"""How toolkit processes write their logs: text lines with a timestamp, or JSON lines.

One handler on the root logger of each process (driver, proxy, replicas, controller),
so user code's loggers come out the same way. Every record carries the request id and,
inside a replica, its application, deployment and replica id. Level and format reach Ray
workers through the environment (``APP_TOOLKIT_LOG_LEVEL``, ``APP_TOOLKIT_LOG_FORMAT``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, Literal

from app_toolkit._runtime import request_context
from app_toolkit.config import LOG_LEVEL_ENV

FORMAT_ENV = "APP_TOOLKIT_LOG_FORMAT"
LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
LEVELS = ("debug", "info", "warning", "error", "critical")

#: Fields every record gets (empty when they do not apply).
CONTEXT_FIELDS = ("request_id", "application", "deployment", "replica", "route")
_TEXT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s%(where)s: %(message)s"
_DATE = "%Y-%m-%dT%H:%M:%S"


class _Context(logging.Filter):
    """Adds the request and replica a record was logged for (unless given as ``extra``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        if not fields.get("request_id"):
            fields["request_id"] = request_context.request_id.get()
        replica = request_context.replica.get()
        if replica is not None:
            fields.setdefault("application", replica.app_name)
            fields.setdefault("deployment", replica.deployment)
            fields.setdefault("replica", replica.replica_id)
        for name in CONTEXT_FIELDS:
            fields.setdefault(name, "")
        where = " ".join(str(fields[name]) for name in ("replica", "request_id") if fields[name])
        fields["where"] = f" [{where}]" if where else ""
        return True


class JSONFormatter(logging.Formatter):
    """One JSON object per line: timestamp (UTC, ISO 8601), level, logger, message, the
    context fields, and the traceback if there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": time.strftime(_DATE, time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, "")
            if value:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(_TEXT, _DATE)
        self.converter = time.gmtime  # timestamps in UTC, like the JSON lines


def configure(level: str | None = None, log_format: str | None = None) -> None:
    """Log this process the toolkit's way (arguments default to the environment's)."""
    level = (level or os.environ.get(LOG_LEVEL_ENV) or "info").lower()
    log_format = (log_format or os.environ.get(FORMAT_ENV) or "text").lower()
    if level not in LEVELS:
        level = "info"
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
