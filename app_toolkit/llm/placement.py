"""Where a model's replica and its engine's workers run: the placement group Ray Serve LLM
reserves per replica, with its rules (Ray 2.60's ``VLLMEngineConfig.placement_bundles``
and ``LLMServer.get_deployment_options``).

An engine of ``tensor_parallel_size`` × ``pipeline_parallel_size`` devices gets one bundle
per device: ``{"GPU": 1}`` with an ``accelerator_type`` (and Ray's
``accelerator_type:<type>`` resource), ``{"CPU": 1}`` without; the replica's own resources
join the first bundle, where the replica runs. ``placement_group_config`` replaces the
bundles (``bundles``, or ``bundle_per_worker`` repeated per device) and the strategy.
A replica of one device on the CPU gets no placement group: its actor options say all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from app_toolkit.config.schema import Strict

Bundle = dict[str, float]
#: What a bundle asks for: resources by name, none negative.
_Asked = dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]]


class PlacementGroupConfig(Strict):
    """``LLMConfig.placement_group_config``: Ray Serve LLM's override of the bundles."""

    bundles: list[_Asked] | None = Field(
        None, description="The bundles, one per engine worker; the replica joins the first."
    )
    bundle_per_worker: _Asked | None = Field(
        None, description="One bundle, repeated for each device (tensor × pipeline parallel size)."
    )
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray's placement strategy for the bundles."
    )

    @model_validator(mode="after")
    def _one_way(self) -> PlacementGroupConfig:
        if (self.bundles is None) == (self.bundle_per_worker is None):
            raise ValueError("give bundles or bundle_per_worker (one of the two), as Ray Serve LLM takes it")
        if self.bundles == []:
            raise ValueError("bundles must hold at least one bundle")
        return self


def accelerator_resource(accelerator_type: str) -> str:
    """Ray's resource for nodes with ``accelerator_type``."""
    return f"accelerator_type:{accelerator_type}"


def engine_bundles(
    devices: int, accelerator_type: str | None, config: PlacementGroupConfig | None
) -> list[Bundle]:
    """The bundles of one replica's engine (before the replica's own resources join the
    first); empty where the replica needs no placement group."""
    hint = {accelerator_resource(accelerator_type): 0.001} if accelerator_type else {}
    if config is not None and config.bundle_per_worker is not None:
        return [{**hint, **config.bundle_per_worker} for _ in range(devices)]
    if config is not None and config.bundles is not None:
        return [{**hint, **bundle} for bundle in config.bundles]
    if accelerator_type is not None:
        return [{"GPU": 1.0, **hint} for _ in range(devices)]
    if devices > 1:
        return [{"CPU": 1.0} for _ in range(devices)]
    return []


def default_strategy(devices: int, accelerator_type: str | None) -> str:
    """The strategy of the bundles :func:`engine_bundles` makes: on the CPU, vLLM's workers
    are processes of the replica (``mp``: ``LLMConfig.executor_backend``), so every bundle
    must be on its node."""
    return "STRICT_PACK" if accelerator_type is None and devices > 1 else "PACK"


def with_replica(bundles: list[Bundle], actor_options: Mapping[str, Any]) -> list[Bundle]:
    """``bundles`` with the replica's own resources (its ``ray_actor_options``) added to
    the first, where the replica runs beside its engine's first worker."""
    own: Bundle = {"CPU": float(actor_options.get("num_cpus", 1))}
    if actor_options.get("num_gpus"):
        own["GPU"] = float(actor_options["num_gpus"])
    if actor_options.get("memory"):
        own["memory"] = float(actor_options["memory"])
    own.update({name: float(amount) for name, amount in (actor_options.get("resources") or {}).items()})
    if actor_options.get("accelerator_type"):
        own.setdefault(accelerator_resource(actor_options["accelerator_type"]), 0.001)
    first = dict(bundles[0])
    for name, amount in own.items():
        first[name] = first.get(name, 0.0) + amount
    return [first, *(dict(bundle) for bundle in bundles[1:])]
