"""One pydantic schema per option: defaults, bounds and descriptions live here only.

Decorator keyword arguments, ``.options()`` and CLI flags are all validated by these
models, and every failure becomes a :class:`~app_toolkit.exceptions.ConfigError` whose
message names the option, the bad value and the allowed range.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from app_toolkit.exceptions import ConfigError

#: Environment variable with the toolkit's log level (``app-toolkit run --log-level``),
#: read by the toolkit's Ray workers when they start.
LOG_LEVEL_ENV = "APP_TOOLKIT_LOG_LEVEL"

#: Application, deployment and pool names (they appear in URLs, actor names and logs).
NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")


#: Marks an option that running replicas take in place (a change never restarts them);
#: every other deployment option is part of the code version.
IN_PLACE: dict[str, JsonValue] = {"applies_in_place": True}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class RayActorOptions(_Strict):
    """Resources each replica actor reserves on the Ray cluster."""

    num_cpus: float = Field(
        0.0,
        ge=0,
        description="Logical CPUs reserved per replica. Defaults to 0 so that I/O-bound "
        "replicas never block scheduling on small machines; set it for CPU-heavy work.",
    )
    num_gpus: float = Field(0.0, ge=0, description="GPUs per replica; fractions share a GPU.")
    memory: int | None = Field(None, ge=0, description="Bytes of memory reserved per replica.")
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources per replica.")
    runtime_env: dict[str, JsonValue] | None = Field(
        None, description="Ray runtime environment for the replica processes."
    )


class AutoscalingConfig(_Strict):
    """How a deployment's replica count follows its load (Ray Serve's names and meanings).

    Load is the number of requests queued and running for the deployment (open streams
    and WebSocket connections included), as the callers report it. The target replica
    count is that load divided by ``target_ongoing_requests``, within
    ``[min_replicas, max_replicas]``; it moves up only after the load has wanted more
    replicas for ``upscale_delay_s`` (at once from zero replicas) and down only after
    ``downscale_delay_s`` of wanting fewer.
    """

    min_replicas: int = Field(1, ge=0, le=10_000, description="Fewest replicas; 0 allows scaling to zero.")
    max_replicas: int = Field(100, ge=1, le=10_000, description="Most replicas.")
    initial_replicas: int | None = Field(
        None, ge=0, le=10_000, description="Replicas to start with; default min_replicas."
    )
    target_ongoing_requests: float = Field(
        2.0, gt=0, description="Queued + running requests each replica should have on average."
    )
    upscale_delay_s: float = Field(
        30.0, ge=0, description="Seconds the load must want more replicas before adding them."
    )
    downscale_delay_s: float = Field(
        600.0, ge=0, description="Seconds the load must want fewer replicas before removing any."
    )
    downscale_to_zero_delay_s: float | None = Field(
        None,
        ge=0,
        description="Seconds without any load before scaling to zero replicas "
        "(min_replicas=0 only); default downscale_delay_s.",
    )
    look_back_period_s: float = Field(
        30.0, gt=0, description="Seconds of load reports averaged for each decision."
    )
    upscaling_factor: float | None = Field(
        None, gt=0, description="Multiplies each upscaling step (below 1: more cautious)."
    )
    downscaling_factor: float | None = Field(
        None, gt=0, description="Multiplies each downscaling step (below 1: more cautious)."
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must not exceed max_replicas ({self.max_replicas})"
            )
        initial = self.initial_replicas
        if initial is not None and not self.min_replicas <= initial <= self.max_replicas:
            raise ValueError(f"initial_replicas ({initial}) must lie between min_replicas and max_replicas")
        return self

    @property
    def start_replicas(self) -> int:
        return self.min_replicas if self.initial_replicas is None else self.initial_replicas


class DeploymentConfig(_Strict):
    """Options of one deployment (Ray Serve's names and meanings)."""

    num_replicas: int = Field(
        1,
        json_schema_extra=IN_PLACE,
        ge=0,
        le=10_000,
        description='Replicas to run; "auto" turns on autoscaling with the defaults of AutoscalingConfig.',
    )
    autoscaling_config: AutoscalingConfig | None = Field(
        None,
        json_schema_extra=IN_PLACE,
        description="Scale the replica count with the load instead of num_replicas.",
    )
    max_ongoing_requests: int = Field(
        100,
        json_schema_extra=IN_PLACE,
        ge=1,
        description="Requests one replica runs at once; further requests wait in the "
        "caller-side queue, never on the replica.",
    )
    max_queued_requests: int = Field(
        1000,
        json_schema_extra=IN_PLACE,
        ge=-1,
        description="Requests each caller (proxy or handle) may queue for this deployment "
        "while every replica is busy; beyond it callers get 503 / BackPressureError. "
        "-1 means unbounded.",
    )
    affinity: Literal["strict", "prefer"] = Field(
        "strict",
        json_schema_extra=IN_PLACE,
        description="Requests with a shard key (the X-SERVE-SHARD-KEY header, or "
        "handle.options(shard_key=...)) go to the replica the key maps to. When it is at "
        "max_ongoing_requests: strict waits for it, prefer sends to another replica.",
    )
    user_config: Any = Field(
        None,
        json_schema_extra=IN_PLACE,
        description="JSON-like value passed to the replica's reconfigure() method.",
    )
    health_check_period_s: float = Field(
        10.0, json_schema_extra=IN_PLACE, gt=0, description="Seconds between health checks of each replica."
    )
    health_check_timeout_s: float = Field(
        30.0,
        json_schema_extra=IN_PLACE,
        gt=0,
        description="Seconds a health check may take before it counts as failed.",
    )
    health_check_failure_threshold: int = Field(
        3,
        json_schema_extra=IN_PLACE,
        ge=1,
        le=100,
        description="Consecutive failed health checks after which a replica "
        "leaves the routing tables and is replaced. The check calls the user's check_health() "
        "on the replica's event loop, so a blocked loop fails it too.",
    )
    graceful_shutdown_wait_loop_s: float = Field(
        2.0,
        json_schema_extra=IN_PLACE,
        gt=0,
        description="Seconds between checks for in-flight work while draining.",
    )
    graceful_shutdown_timeout_s: float = Field(
        20.0,
        json_schema_extra=IN_PLACE,
        ge=0,
        description="Seconds a draining replica may finish in-flight work.",
    )
    ray_actor_options: RayActorOptions = Field(
        default_factory=RayActorOptions, description="Ray resources of each replica."
    )

    @model_validator(mode="before")
    @classmethod
    def _auto_replicas(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        if data.get("num_replicas") == "auto":
            data = {key: value for key, value in data.items() if key != "num_replicas"}
            if data.get("autoscaling_config") is None:
                data["autoscaling_config"] = {}
        elif "num_replicas" in data and data.get("autoscaling_config") is not None:
            raise ValueError(
                "set either num_replicas or autoscaling_config, not both "
                '(num_replicas="auto" autoscales with default settings)'
            )
        return data

    @classmethod
    def in_place_options(cls) -> frozenset[str]:
        """Options whose change running replicas take in place (``user_config`` through
        ``reconfigure()``); a change of any other option starts new replicas."""
        return frozenset(
            name
            for name, field in cls.model_fields.items()
            if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("applies_in_place")
        )

    @property
    def initial_replicas(self) -> int:
        """How many replicas a new deployment starts with."""
        if self.autoscaling_config is not None:
            return self.autoscaling_config.start_replicas
        return self.num_replicas


class BatchConfig(_Strict):
    """Options of ``@batch`` (Ray Serve's names and meanings)."""

    max_batch_size: int = Field(10, ge=1, description="Most items (or size units) in one batch.")
    batch_wait_timeout_s: float = Field(
        0.01, ge=0, description="Longest wait, from a batch's first item, before it runs anyway."
    )
    max_concurrent_batches: int = Field(1, ge=1, description="Batches of one replica running at once.")


class HTTPOptions(_Strict):
    """Where the HTTP proxy listens."""

    host: str = Field("127.0.0.1", min_length=1, description="Interface the proxy binds.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    max_request_body_bytes: int = Field(
        100 << 20,
        ge=1,
        description="Largest request body the proxy accepts (it buffers "
        "bodies before forwarding them); bigger ones get 413.",
    )
    max_buffered_body_bytes: int = Field(
        1 << 30,
        ge=1,
        description="Request bodies one proxy holds at once, all requests together; a request "
        "whose body would pass it gets 503 with Retry-After. At least max_request_body_bytes.",
    )
    request_timeout_s: float | None = Field(
        None,
        gt=0,
        description="End-to-end deadline of every HTTP request, upload included (504 when it "
        "passes; 408 if the body was still arriving). A route's @deadline or the "
        "x-request-timeout-seconds header may set an earlier one.",
    )
    keep_alive_timeout_s: int = Field(
        5, ge=1, description="Seconds a connection with no request in progress stays open."
    )
    max_header_bytes: int = Field(
        16 << 10,
        ge=1024,
        description="Largest request line plus headers; a bigger request head gets 431 and the "
        "connection is closed.",
    )
    header_timeout_s: float = Field(
        10,
        gt=0,
        description="Time a request head may take to arrive from its first byte; a slower one "
        "gets 408 and the connection is closed (slowloris).",
    )
    body_timeout_s: float = Field(
        30,
        gt=0,
        description="Longest pause between two pieces of a request body; a longer one gets 408.",
    )
    max_connections: int = Field(
        4096,
        ge=1,
        description="Open client connections one proxy keeps; a new one beyond it gets 503 with "
        "Retry-After and is closed.",
    )
    websocket_max_message_bytes: int = Field(
        1 << 20,
        ge=1,
        description="Largest WebSocket message; bigger ones close the "
        "connection with 1009 (message too big).",
    )
    access_log: bool = Field(
        True,
        description="Log one line per HTTP request on the 'app_toolkit.access' logger "
        "(client, method, path, status, milliseconds; 499 when the client left first).",
    )
    root_path: str = Field(
        "",
        description="Path prefix a reverse proxy in front strips before forwarding "
        "(e.g. /api): apps see it as root_path, so their links and docs include it.",
    )
    proxy_headers: bool = Field(
        True,
        description="Take the client's address and scheme from X-Forwarded-For / "
        "X-Forwarded-Proto sent by the hosts in forwarded_allow_ips.",
    )
    forwarded_allow_ips: str = Field(
        "127.0.0.1",
        description="Comma-separated addresses (or *) whose X-Forwarded-* headers are trusted.",
    )
    metrics_allow_ips: str = Field(
        "127.0.0.1,::1",
        description="Comma-separated client addresses or networks (10.0.0.0/8) that may read "
        "/-/metrics (Prometheus), or * for anyone; others get 403.",
    )
    shard_key_header: str = Field(
        "x-serve-shard-key",
        pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$",
        description="Request header whose value is the shard key: requests with the same key "
        "go to the same replica of the deployment (see its affinity option).",
    )
    dashboard_allow_ips: str = Field(
        "127.0.0.1,::1",
        description="Comma-separated client addresses or networks that may open the live "
        "status page /-/dashboard, or * for anyone; others need dashboard_token.",
    )
    dashboard_token: str | None = Field(
        None,
        min_length=16,
        description="A secret that also opens /-/dashboard from any address (?token=... once, "
        "or Authorization: Bearer ...); at least 16 characters. Unset: no token opens it.",
    )
    proxy_location: Literal["EveryNode", "HeadOnly", "Disabled"] = Field(
        "EveryNode",
        description="Run a proxy on every node of the cluster (each serves every app; nodes "
        "that join get one), only on the head node, or none (Disabled: handles only). "
        "Proxies on one machine share the port.",
    )

    @model_validator(mode="after")
    def _check_body_budget(self) -> HTTPOptions:
        if self.max_buffered_body_bytes < self.max_request_body_bytes:
            raise ValueError(
                "max_buffered_body_bytes must be at least max_request_body_bytes "
                f"({self.max_request_body_bytes}), or no request that large could ever be served"
            )
        return self

    @field_validator("metrics_allow_ips", "dashboard_allow_ips")
    @classmethod
    def _check_allow_ips(cls, value: str) -> str:
        from app_toolkit._runtime.proxy.metrics_page import parse_networks

        parse_networks(value)
        return value

    @field_validator("root_path")
    @classmethod
    def _check_root_path(cls, value: str) -> str:
        if value and (not value.startswith("/") or value.endswith("/")):
            raise ValueError("must be empty or a path like '/api' (a leading '/', no trailing '/')")
        return value


class ApplicationOptions(_Strict):
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
        if value is None:
            return None
        if not value.startswith("/"):
            raise ValueError(f"must start with '/', e.g. '/{value}'")
        if len(value) > 1 and value.endswith("/"):
            raise ValueError(f"must not end with '/', e.g. {value.rstrip('/')!r}")
        if "{" in value or "}" in value:
            raise ValueError("must be a fixed path without '{parameters}'")
        return value


def _explain(error: ValidationError, where: str) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "value"
        if item["type"] == "extra_forbidden":
            lines.append(f"unknown option {field!r}")
            continue
        message = item["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        lines.append(f"{field} {message}, got {item.get('input')!r}")
    return f"Invalid {where}: " + "; ".join(lines)


def default_of(model: type[BaseModel], name: str) -> Any:
    """The default of one option, for signatures that repeat a model's options."""
    return model.model_fields[name].get_default(call_default_factory=True)


M = TypeVar("M", bound=BaseModel)


def parse_options(model: type[M], options: Mapping[str, object], where: str) -> M:
    """Validate ``options`` against ``model``, raising ConfigError with a readable message."""
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        raise ConfigError(_explain(exc, where)) from None


def parse_deployment_config(options: Mapping[str, object], where: str) -> DeploymentConfig:
    """Validate deployment options, raising ConfigError with a readable message."""
    try:
        return DeploymentConfig.model_validate(dict(options))
    except ValidationError as exc:
        raise ConfigError(_explain(exc, where)) from None


def parse_batch_config(options: Mapping[str, object], where: str) -> BatchConfig:
    """Validate ``@batch`` options."""
    try:
        return BatchConfig.model_validate(dict(options))
    except ValidationError as exc:
        raise ConfigError(_explain(exc, where)) from None


def parse_http_options(options: Mapping[str, object]) -> HTTPOptions:
    """Validate proxy options."""
    try:
        return HTTPOptions.model_validate(dict(options))
    except ValidationError as exc:
        raise ConfigError(_explain(exc, "HTTP options")) from None


def parse_application_options(name: str, route_prefix: str | None) -> ApplicationOptions:
    """Validate an application's name and route prefix."""
    try:
        return ApplicationOptions(name=name, route_prefix=route_prefix)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, f"application {name!r}")) from None
