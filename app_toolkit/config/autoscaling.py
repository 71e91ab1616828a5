"""Autoscaling options of a deployment: the bounds, delays and factors of its replica
count, and a custom policy (Ray Serve's names and meanings)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_serializer, field_validator, model_validator

from app_toolkit.config.schema import Strict, json_values
from app_toolkit.exceptions import ConfigError
from app_toolkit.import_path import split_import_path

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
        description='The policy: a function, or its import path ("module:function" or '
        '"module.function"); the default is the built-in policy on requests queued and running.',
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
        return json_values(value)

    @field_validator("policy_function")
    @classmethod
    def _import_path(cls, value: str | Callable[..., Any]) -> str | Callable[..., Any]:
        if not callable(value):
            try:
                split_import_path(value)
            except ConfigError as exc:
                raise ValueError(f"must be a function or its import path: {exc}") from None
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
