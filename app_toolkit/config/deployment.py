"""The options of one deployment, its replicas' resources, the overload answer and
``@batch`` (Ray Serve's names and meanings); autoscaling's are in ``config.autoscaling``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, JsonValue, ValidationError, model_validator

from app_toolkit.config.autoscaling import AutoscalingConfig
from app_toolkit.config.logging_config import LoggingConfig
from app_toolkit.config.ray_serve_only import drop_ray_serve_only
from app_toolkit.config.request_router import RequestRouterConfig
from app_toolkit.config.schema import IN_PLACE, Strict, explain, field_errors
from app_toolkit.exceptions import ConfigError, DefinitionError


class RayActorOptions(Strict):
    """Resources each replica actor reserves on the Ray cluster.

    Ray's ``accelerator_type`` is taken as Ray defines it: 0.001 of the resource
    ``accelerator_type:<type>``, added to ``resources``.
    """

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

    @model_validator(mode="before")
    @classmethod
    def _ray_serve_fields(cls, data: object) -> object:
        data = drop_ray_serve_only("ray_actor_options", data)
        if not isinstance(data, dict):
            return data
        # Ray Serve: null CPUs or GPUs take the default.
        data = {
            key: value
            for key, value in data.items()
            if value is not None or key not in ("num_cpus", "num_gpus")
        }
        accelerator = data.pop("accelerator_type", None)
        if accelerator is not None:
            # Ray's meaning of accelerator_type: a sliver of the resource every node with
            # that accelerator has ("accelerator_type:A100").
            if not isinstance(accelerator, str) or not accelerator:
                message = 'must name an accelerator type, e.g. "A100"'
                raise field_errors("ray_actor_options", {"accelerator_type": (accelerator, message)})
            resources = data.get("resources") or {}
            if isinstance(resources, dict):
                data["resources"] = {**resources, f"accelerator_type:{accelerator}": 0.001}
        return data


class BackpressureConfig(Strict):
    """The HTTP answer to a request refused because ``max_queued_requests`` callers'
    requests already wait (Ray Serve's option). A handle raises ``BackPressureError``."""

    status_code: Literal[503, 429] = Field(
        503, description="503 Service Unavailable, or 429 Too Many Requests."
    )
    retry_after_s: float | None = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="The Retry-After header, in seconds (rounded up); None sends none "
        "(Ray Serve's default; the toolkit's is 1 s).",
    )


class DeploymentConfig(Strict):
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
        "-1 (Ray Serve's 'no bound') means a fixed bound of 100,000 per caller. It holds from "
        "a caller's first request: a new deployment's first replica is awaited within it.",
    )
    backpressure_config: BackpressureConfig = Field(
        default_factory=BackpressureConfig,
        json_schema_extra=IN_PLACE,
        description="The HTTP answer when max_queued_requests is reached (status and Retry-After).",
    )
    affinity: Literal["strict", "prefer"] = Field(
        "strict",
        json_schema_extra=IN_PLACE,
        description="Requests with a shard key (the X-SERVE-SHARD-KEY header, or "
        "handle.options(shard_key=...)) go to the replica the key maps to. When it is at "
        "max_ongoing_requests: strict waits for it, prefer sends to another replica.",
    )
    request_router_config: RequestRouterConfig | None = Field(
        None,
        json_schema_extra=IN_PLACE,
        description="The router each caller picks this deployment's replicas with "
        "(request_router_class and request_router_kwargs; docs/routing.md); null: power of "
        "two choices on the caller's requests in flight.",
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
    rolling_update_percentage: float | None = Field(
        None,
        json_schema_extra=IN_PLACE,
        gt=0,
        le=1,
        description="Ray Serve's rolling update: the fraction of the replicas (in (0, 1], "
        "despite the name) an upgrade replaces at a time. Unset, with max_surge_percent "
        "unset too: the upgrade surges while the cluster has room and replaces 20 % at a "
        "time only when it has none (docs/deployments.md).",
    )
    max_surge_percent: int | None = Field(
        None,
        json_schema_extra=IN_PLACE,
        ge=0,
        le=100,
        description="Ray Serve's surge: how many new replicas (percent of the target, "
        "rounded up) an upgrade starts beside the old ones; 0 stops old replicas before "
        "their successors start.",
    )
    surge_timeout_s: float = Field(
        30.0,
        json_schema_extra=IN_PLACE,
        gt=0,
        description="For an upgrade with neither rolling_update_percentage nor "
        "max_surge_percent set: how long a new replica may wait for room beside the old "
        "ones before the upgrade replaces old replicas in steps of 20 %.",
    )
    continuation_wait_s: float | None = Field(
        None,
        json_schema_extra=IN_PLACE,
        gt=0,
        allow_inf_nan=False,
        description="How long a stream of a continuable method (@continuable) whose "
        "replica was lost waits for another replica to take it (with one replica: its "
        "replacement) before it ends with the loss; None: the method's own wait_s. A "
        "model of app_toolkit.llm sets it from its engine's start time.",
    )
    max_replicas_per_node: int | None = Field(
        None,
        ge=1,
        le=100,
        description="Most replicas of this deployment on one Ray node (1..100); replicas "
        "beyond it wait for another node.",
    )
    placement_group_bundles: list[dict[str, float]] | None = Field(
        None,
        description="Resources to reserve for each replica as a Ray placement group: the "
        "replica's actor runs in the first bundle (its ray_actor_options must fit there), "
        "the others are for the tasks and actors it starts.",
    )
    placement_group_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] | None = Field(
        None,
        description="How a replica's placement group bundles are spread over nodes "
        "(default PACK); only with placement_group_bundles.",
    )
    logging_config: LoggingConfig | None = Field(
        None,
        json_schema_extra=IN_PLACE,
        description="Its replicas' log level and format, and (an ingress) whether its "
        "application's requests get access lines; None: its application's logging_config, "
        "else the process's (docs/observability.md).",
    )
    direct_ingress: bool = Field(
        True,
        description="For an application's ingress on Ray: each replica serves the client "
        "connections its node's proxy hands it, in its own process (docs/http.md). False: "
        "the proxy serves the connections and forwards every request (a replica that dies "
        "then costs its requests a 502/503 answer rather than their connections).",
    )

    @model_validator(mode="before")
    @classmethod
    def _auto_replicas(cls, data: object) -> object:
        data = drop_ray_serve_only("deployment", data)
        if not isinstance(data, dict):
            return data
        if "num_replicas" in data and data["num_replicas"] is None:
            # Ray Serve's null: not set (serve build writes it beside autoscaling_config).
            data = {key: value for key, value in data.items() if key != "num_replicas"}
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

    @model_validator(mode="after")
    def _check_wake_up(self) -> DeploymentConfig:
        autoscaling = self.autoscaling_config
        if self.max_queued_requests == 0 and autoscaling is not None and autoscaling.min_replicas == 0:
            raise ValueError(
                "max_queued_requests=0 with autoscaling_config.min_replicas=0: at zero replicas "
                "every request would be refused and none would start a replica; set "
                "max_queued_requests to 1 or more (or -1), or min_replicas to 1"
            )
        return self

    @model_validator(mode="after")
    def _check_placement(self) -> DeploymentConfig:
        bundles = self.placement_group_bundles
        if bundles is None:
            if self.placement_group_strategy is not None:
                raise ValueError(
                    "placement_group_strategy needs placement_group_bundles: set both, or "
                    "remove placement_group_strategy"
                )
            return self
        if self.max_replicas_per_node is not None:
            raise ValueError(
                "Setting max_replicas_per_node is not allowed when placement_group_bundles is "
                "provided; remove one of them (STRICT_SPREAD bundles spread a replica's "
                "resources over nodes)"
            )
        problem = bundles_problem(bundles, self.ray_actor_options)
        if problem is not None:
            raise ValueError(problem)
        return self

    def reserved_resources(self) -> dict[str, float]:
        """What one replica reserves on a node, named as Ray names resources (its actor's,
        or with placement groups the sum of its bundles)."""
        if self.placement_group_bundles is not None:
            total: dict[str, float] = {}
            for bundle in self.placement_group_bundles:
                for name, amount in bundle.items():
                    total[name] = total.get(name, 0.0) + amount
            return {name: amount for name, amount in total.items() if amount}
        options = self.ray_actor_options
        asks = {"CPU": options.num_cpus, "GPU": options.num_gpus, **options.resources}
        if options.memory:
            asks["memory"] = float(options.memory)
        return {name: amount for name, amount in asks.items() if amount}

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


def bundles_problem(bundles: list[dict[str, float]], actor: RayActorOptions) -> str | None:
    """What is wrong with placement group ``bundles`` for a replica asking ``actor``
    (Ray Serve's rules: non-empty bundles of non-negative amounts, and the replica's own
    resources within the first bundle, where its actor runs)."""
    if not bundles:
        return 'placement_group_bundles must list at least one bundle, e.g. [{"CPU": 1, "GPU": 1}]'
    for index, bundle in enumerate(bundles):
        if not bundle or not any(amount > 0 for amount in bundle.values()):
            return f"placement_group_bundles[{index}] reserves nothing: give it a resource, e.g. {{'CPU': 1}}"
        negative = sorted(name for name, amount in bundle.items() if amount < 0)
        if negative:
            return (
                f"placement_group_bundles[{index}] asks for a negative amount of {negative[0]}: "
                "give every resource a positive amount, or leave it out"
            )
    first = bundles[0]
    asks = {"CPU": actor.num_cpus, "GPU": actor.num_gpus, "memory": actor.memory or 0, **actor.resources}
    for name, amount in asks.items():
        if amount > first.get(name, 0):
            option = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}.get(
                name, f"resources[{name!r}]"
            )
            return (
                "the replica's actor runs in the first placement group bundle, so its "
                f"ray_actor_options must fit there: {option} is {amount:g} but the first bundle "
                f"has {first.get(name, 0):g} {name}; add it to the first bundle or lower {option}"
            )
    return None


class BatchConfig(Strict):
    """Options of ``@batch`` (Ray Serve's names and meanings)."""

    max_batch_size: int = Field(10, ge=1, description="Most items (or size units) in one batch.")
    batch_wait_timeout_s: float = Field(
        0.01, ge=0, description="Longest wait, from a batch's first item, before it runs anyway."
    )
    max_concurrent_batches: int = Field(1, ge=1, description="Batches of one replica running at once.")


def parse_deployment_config(options: Mapping[str, object], where: str) -> DeploymentConfig:
    """Validate deployment options, raising ConfigError with a readable message."""
    try:
        return DeploymentConfig.model_validate(dict(options))
    except ValidationError as exc:
        raise ConfigError(explain(exc, where)) from None


def parse_batch_config(options: Mapping[str, object], where: str) -> BatchConfig:
    """Validate ``@batch`` options: a value of the wrong type is a ``DefinitionError`` (a
    ``TypeError`` too), a value out of range a ``ConfigError``, as Ray Serve's types go."""
    try:
        return BatchConfig.model_validate(dict(options))
    except ValidationError as exc:
        wrong_type = any(
            not error["type"].startswith(("greater_than", "less_than"))
            or error["loc"] == ("max_concurrent_batches",)  # a TypeError in Ray Serve
            for error in exc.errors()
        )
        raise (DefinitionError if wrong_type else ConfigError)(explain(exc, where)) from None
