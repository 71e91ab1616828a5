"""How one application is exposed: its name and route prefix."""

from __future__ import annotations

from pydantic import Field, ValidationError, field_validator

from app_toolkit.config.ray_serve_only import drop_ray_serve_only
from app_toolkit.config.schema import NAME_RE, Strict, explain
from app_toolkit.exceptions import ConfigError


class ApplicationOptions(Strict):
    """How one application is exposed."""

    name: str = Field("default", description="Unique application name.")
    route_prefix: str | None = Field("/", description="URL prefix of the app's routes; None serves no HTTP.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise ValueError("use letters, digits, '_', '-' or '.' only (it appears in URLs and logs)")
        return value

    @field_validator("route_prefix")
    @classmethod
    def _check_prefix(cls, value: str | None) -> str | None:
        problem = route_prefix_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


def route_prefix_problem(value: str | None) -> str | None:
    """What is wrong with a route prefix, in Ray Serve's words then how to fix it."""
    if value is None:
        return None
    if not value.startswith("/"):
        return f"must start with a forward slash ('/'), e.g. '/{value}'"
    if len(value) > 1 and value.endswith("/"):
        return f"may not end with a trailing '/', e.g. {value.rstrip('/')!r}"
    if "{" in value or "}" in value:
        return "may not contain wildcards: a fixed path without '{parameters}'"
    if value == "/-" or value.startswith("/-/"):
        return "may not be under '/-/': the toolkit's own pages (/-/healthz, /-/metrics) are there"
    return None


def parse_application_options(
    name: str, route_prefix: str | None, external_scaler_enabled: bool = False
) -> ApplicationOptions:
    """Validate an application's name and route prefix (and Ray Serve's
    ``external_scaler_enabled``, taken only as False, as in config files)."""
    problem = route_prefix_problem(route_prefix)
    if problem is not None:  # said as Ray Serve says it (a ValueError too)
        raise ConfigError(f"Invalid route_prefix {route_prefix!r}, {problem}")
    try:
        drop_ray_serve_only("application", {"external_scaler_enabled": external_scaler_enabled})
        return ApplicationOptions(name=name, route_prefix=route_prefix)
    except ValidationError as exc:
        raise ConfigError(explain(exc, f"application {name!r}")) from None
