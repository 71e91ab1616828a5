"""``logging_config``: how a part logs (Ray Serve's ``LoggingConfig``, names and meanings).

One schema for its three places: a config file's top level (the processes' own level and
format, and the access log), an application (the default of its deployments), and a
deployment (its replicas' level and format, and for an ingress the access lines of its
application's requests).
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import Field, field_validator, model_validator

from app_toolkit.config.ray_serve_only import drop_ray_serve_only
from app_toolkit.config.schema import Strict

_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


class LoggingConfig(Strict):
    """How a deployment's replicas (or the toolkit's processes) log.

    ``logs_dir`` and ``additional_log_standard_attrs`` are accepted only at their
    defaults: logs go to standard error, which Ray keeps in its session's logs directory.
    """

    encoding: Literal["TEXT", "JSON"] = Field(
        "TEXT", description="TEXT lines, or one JSON object per line (structured logs)."
    )
    log_level: str = Field(
        "INFO",
        description="Records below this level are not written: DEBUG, INFO, WARNING, "
        "ERROR or CRITICAL (or 10..50). In a deployment, its replicas' loggers, yours included.",
    )
    enable_access_log: bool = Field(
        True,
        description="Write one access line per HTTP request (in a deployment: the "
        "requests of the application whose ingress it is).",
    )

    @model_validator(mode="before")
    @classmethod
    def _ray_serve_fields(cls, data: object) -> object:
        return drop_ray_serve_only("logging", data)

    @field_validator("encoding", mode="before")
    @classmethod
    def _encoding_name(cls, value: object) -> object:
        return getattr(value, "value", value)  # Ray Serve's EncodingType enum

    @field_validator("log_level", mode="before")
    @classmethod
    def _known_level(cls, value: object) -> str:
        name = logging.getLevelName(value) if isinstance(value, int) else str(value).upper()
        if isinstance(value, bool) or name not in _LEVELS:
            raise ValueError("must be DEBUG, INFO, WARNING, ERROR or CRITICAL (or 10..50)")
        return str(name)

    def level_name(self) -> str:
        """The level as a lower-case name (``info``)."""
        return self.log_level.lower()

    @property
    def level_number(self) -> int:
        """The level as ``logging`` numbers it (``logging.INFO``)."""
        return logging.getLevelNamesMapping()[self.log_level]


def logs_access(config: LoggingConfig | None) -> bool:
    """Whether requests under ``config`` (None: none set) get access lines."""
    return config is None or config.enable_access_log
