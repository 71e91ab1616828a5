"""The options of one deployment, its replicas' resources, autoscaling, the overload
answer and ``@batch`` (Ray Serve's names and meanings)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import (
    Field,
    JsonValue,
    PrivateAttr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from app_toolkit.config.logging_config import LoggingConfig
from app_toolkit.config.ray_serve_only import drop_ray_serve_only
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


#: Ray Serve's names of its built-in request-count policy: in code or a file they select
#: the built-in policy here.
BUILT_IN_POLICIES = frozenset(
    {
        "ray.serve.autoscaling_policy:default_autoscaling_policy",
        "ray.serve.autoscaling_policy.default_autoscaling_policy",
        "ray.serve.autoscaling_policy:replica_queue_length_autoscaling_policy",
        "ray.serve.autoscaling_policy.replica_queue_length_autoscaling_policy",
    }
)
DEFAULT_POLICY = "ray.serve.autoscaling_policy:default_autoscaling_policy"

#: How samples over the look-back window become one value (Ray Serve's AggregationFunction).
AggregationFunction = Literal["mean", "max", "min"]


class AutoscalingPolicy(Strict):
    """A custom autoscaling policy (Ray Serve's ``AutoscalingPolicy``).

    ``policy_function`` is a function, or its import path ("module:function" or
    "module.function"). A deployment's policy takes an :class:`~app_toolkit.AutoscalingContext`
    and returns ``(replicas, policy_state)``; an application's (the config file's
    ``autoscaling_policy``) takes ``{DeploymentID: AutoscalingContext}`` and returns
    ``({DeploymentID: replicas}, {DeploymentID: policy_state})``. It travels to the
    controller by value (docs/autoscaling.md). A class is made once per deployment (or
    application) with ``policy_kwargs``, and its instance called in the same way.
    """

    policy_function: str | Callable[..., Any] = Field(
        DEFAULT_POLICY,
        description='The policy: a function, or its import path "module:function"; the '
        "default is the built-in policy on requests queued and running.",
    )
    policy_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="When policy_function is a class: the keyword arguments it is made "
        "with (JSON values), once per deployment; its instance is then called.",
    )
    # The function as the backend serialized it (build.py), for the controller.
    _serialized: bytes = PrivateAttr(b"")

    @field_validator("policy_kwargs")
    @classmethod
    def _json_values(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"must hold JSON values only (strings, numbers, lists, dicts): {exc}") from None
        return value

    @field_validator("policy_function")
    @classmethod
    def _import_path(cls, value: str | Callable[..., Any]) -> str | Callable[..., Any]:
        if callable(value):
            return value
        module, _, attribute = value.partition(":") if ":" in value else value.rpartition(".")
        parts = [*module.split("."), *attribute.split(".")]
        if not (module and attribute and all(part.isidentifier() for part in parts)):
            raise ValueError('must be a function or an import path like "module:function"')
        return value

    def __eq__(self, other: object) -> bool:
        """Equal by what the user set: a policy serialized in two builds (a config file
        applied again) is the same policy, though its bytes may differ (as in Ray Serve)."""
        if not isinstance(other, AutoscalingPolicy):
            return NotImplemented
        return (self.name, self.policy_kwargs) == (other.name, other.policy_kwargs)

    def __hash__(self) -> int:
        return hash((self.name, json.dumps(self.policy_kwargs, sort_keys=True)))

    @field_serializer("policy_function")
    def _as_path(self, value: str | Callable[..., Any]) -> str:
        return value if isinstance(value, str) else policy_path(value)

    @property
    def is_default(self) -> bool:
        """Whether this is the built-in policy."""
        return isinstance(self.policy_function, str) and self.policy_function in BUILT_IN_POLICIES

    @property
    def name(self) -> str:
        """The policy's import path ("module:function")."""
        return self._as_path(self.policy_function)

    @property
    def serialized(self) -> bytes:
        """The function as the backend wrote it (empty before build)."""
        return self._serialized

    def travelling(self, serialized: bytes) -> AutoscalingPolicy:
        """This policy named by its path, carrying the function as ``serialized`` bytes."""
        # Not validated again: the path of a function defined in another (with
        # "<locals>") names it for status and logs, though it could not be imported.
        policy = AutoscalingPolicy.model_construct(
            policy_function=self.name, policy_kwargs=self.policy_kwargs
        )
        policy._serialized = serialized
        return policy


def policy_path(function: Callable[..., Any]) -> str:
    """``function``'s import path, "module:qualified.name"."""
    module = getattr(function, "__module__", None) or "__main__"
    return f"{module}:{getattr(function, '__qualname__', type(function).__qualname__)}"


class AutoscalingConfig(Strict):
    """How a deployment's replica count follows its load (Ray Serve's names and meanings).

    Load is the number of requests queued and running for the deployment (open streams
    and WebSocket connections included), as the callers report it. The target replica
    count is that load divided by ``target_ongoing_requests``, within
    ``[min_replicas, max_replicas]``; it moves up only after the load has wanted more
    replicas for ``upscale_delay_s`` (at once from zero replicas) and down only after
    ``downscale_delay_s`` of wanting fewer. A custom ``policy`` replaces the division: it
    says how many replicas it wants, and the factors, bounds and delays apply on top.
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
        30.0, gt=0, description="Seconds of load reports (and custom metrics) aggregated for each decision."
    )
    aggregation_function: AggregationFunction = Field(
        "mean",
        description="How the samples of the look-back period become one value: mean "
        "(time-weighted for custom metrics), max (reacts to spikes) or min (cautious).",
    )
    metrics_interval_s: float = Field(
        10.0,
        gt=0,
        description="Seconds between calls of a replica's record_autoscaling_stats() "
        "(custom metrics). Request loads are reported every 0.5 s whatever it says (Ray "
        "Serve deprecates the field for its load reports).",
    )
    upscaling_factor: float | None = Field(
        None, gt=0, description="Multiplies each upscaling step (below 1: more cautious)."
    )
    downscaling_factor: float | None = Field(
        None, gt=0, description="Multiplies each downscaling step (below 1: more cautious)."
    )
    smoothing_factor: float = Field(
        1.0,
        gt=0,
        description="Deprecated in Ray Serve: both factors, where upscaling_factor, "
        "downscaling_factor and the smoothing factors below are unset.",
    )
    upscale_smoothing_factor: float | None = Field(
        None, gt=0, description="Deprecated in Ray Serve: upscaling_factor where that is unset."
    )
    downscale_smoothing_factor: float | None = Field(
        None, gt=0, description="Deprecated in Ray Serve: downscaling_factor where that is unset."
    )
    policy: AutoscalingPolicy = Field(
        default_factory=AutoscalingPolicy,
        description="A custom policy deciding the replica count (docs/autoscaling.md); "
        "default: the built-in one on requests queued and running.",
    )

    @field_validator("aggregation_function", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        text = getattr(value, "value", value)  # Ray Serve's AggregationFunction enum
        return text.lower() if isinstance(text, str) else value

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

    @property
    def upscale_factor(self) -> float:
        """The factor of upscaling steps, with Ray Serve's deprecated fallbacks."""
        return self.upscaling_factor or self.upscale_smoothing_factor or self.smoothing_factor

    @property
    def downscale_factor(self) -> float:
        """The factor of downscaling steps, with Ray Serve's deprecated fallbacks."""
        return self.downscaling_factor or self.downscale_smoothing_factor or self.smoothing_factor


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
