"""``request_router_config``: which request router a deployment's callers use (Ray Serve's
``RequestRouterConfig``; docs/routing.md).

``request_router_class`` is a class or its import path (``"module:Class"`` or
``"module.Class"``, as Ray reads it). Ray Serve's names of its power-of-two router and of
Ray Serve LLM's prefix-aware router select this toolkit's (:data:`RAY_ROUTERS`); Ray's
other routers, and classes built on Ray's private router API, are refused by name. A
class of your own subclasses :class:`app_toolkit.request_router.RequestRouter` and lives
in a module every caller can import (it is made in each proxy and handle, by its import
path). ``request_routing_stats_period_s`` and ``request_routing_stats_timeout_s`` pace a
replica's ``record_routing_stats()`` (``_runtime/replica/routing_stats.py``).
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import Field, field_validator, model_validator

from app_toolkit.config.schema import Strict, json_values
from app_toolkit.import_path import colon_form

#: The default router: power of two choices (routed by the callers' own chooser).
POWER_OF_TWO = "app_toolkit.request_router:PowerOfTwoChoicesRequestRouter"
#: The prefix-aware router (``request_router/prefix_aware.py``).
PREFIX_AWARE = "app_toolkit.request_router.prefix_aware:PrefixCacheAffinityRouter"
#: Ray Serve's names of the routers implemented here, written "module:Class" (a path
#: written "module.Class" is looked up in this form).
RAY_ROUTERS = {
    "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter": POWER_OF_TWO,
    "ray.serve._private.request_router.pow_2_router:PowerOfTwoChoicesRequestRouter": POWER_OF_TWO,
    "ray.serve.request_router:PowerOfTwoChoicesRequestRouter": POWER_OF_TWO,
    "ray.serve.llm.request_router:PrefixCacheAffinityRouter": PREFIX_AWARE,
    # Where Ray 2.60 keeps the class ray.serve.llm.request_router re-exports.
    "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:PrefixCacheAffinityRouter": (
        PREFIX_AWARE
    ),
    "ray.llm._internal.serve.request_router.prefix_aware.prefix_aware_router:PrefixCacheAffinityRouter": (
        PREFIX_AWARE
    ),
    "ray.llm._internal.serve.request_router.prefix_aware.prefix_aware_router:PrefixAwarePow2ReplicaRouter": (
        PREFIX_AWARE
    ),
}
#: Ray Serve's routing fields with no counterpart here, and the only values taken (Ray's defaults).
_RAY_DEFAULTS: dict[str, float] = {
    "initial_backoff_s": 0.025,
    "backoff_multiplier": 2.0,
    "max_backoff_s": 0.5,
}


class RequestRouterConfig(Strict):
    """A deployment's request router (Ray Serve's ``RequestRouterConfig``)."""

    request_router_class: str | type = Field(
        POWER_OF_TWO,
        description="The router: a RequestRouter subclass, or its import path "
        '("module:Class" or "module.Class"; Ray Serve\'s names of its power-of-two and '
        "prefix-aware routers select this toolkit's).",
    )
    request_router_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the router's initialize_state (JSON values).",
    )
    request_routing_stats_period_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds between calls of a replica's record_routing_stats(), whose result "
        "request routers read as RunningReplica.routing_stats (made while the deployment has a "
        "request router other than plain power of two choices).",
    )
    request_routing_stats_timeout_s: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds one record_routing_stats() call may take; past it the call is "
        "cancelled, logged, and routers keep the replica's last stats.",
    )

    @model_validator(mode="before")
    @classmethod
    def _ray_only(cls, data: object) -> object:
        """Ray's back-off fields: taken at Ray's defaults, dropped."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name, default in _RAY_DEFAULTS.items():
            value = data.pop(name, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or float(value) != default:
                raise ValueError(
                    f"{name}={value!r} is not implemented (callers count their own requests in "
                    "flight and back off from a full replica on their own); remove it"
                )
        return data

    @field_validator("request_router_class")
    @classmethod
    def _class_path(cls, value: str | type) -> str:
        path = colon_form(value) if isinstance(value, str) else _path_of(value)
        path = RAY_ROUTERS.get(path, path)
        if path.startswith("ray."):
            raise ValueError(
                f"{value} is one of Ray Serve's routers that app_toolkit does not implement (it needs "
                "Ray's private router API); use PowerOfTwoChoicesRequestRouter or "
                "PrefixCacheAffinityRouter, or a class of your own (docs/routing.md)"
            )
        return path

    @field_validator("request_router_kwargs")
    @classmethod
    def _json_values(cls, value: dict[str, Any]) -> dict[str, Any]:
        return json_values(value)

    @model_validator(mode="after")
    def _makes_a_router(self) -> RequestRouterConfig:
        """Made here once, as each caller will make it: a class that cannot be imported or
        refuses its kwargs fails now, naming the fix."""
        from app_toolkit.request_router.loading import make_router

        make_router(self.class_path, self.request_router_kwargs)
        return self

    @property
    def class_path(self) -> str:
        """The router's import path (a class was given: its path)."""
        path = self.request_router_class
        assert isinstance(path, str)  # the validator made it one
        return path

    @property
    def is_default(self) -> bool:
        """Power of two choices with no kwargs: the callers' own chooser routes."""
        return self.class_path == POWER_OF_TWO and not self.request_router_kwargs


def _path_of(router: type) -> str:
    """A class's import path; a class no caller could import, or built on Ray's private
    API, is refused naming the fix."""
    module, name = router.__module__, router.__qualname__
    ray_bases = [base for base in inspect.getmro(router) if base.__module__.startswith("ray.")]
    if ray_bases and f"{module}:{name}" not in RAY_ROUTERS:
        base = ray_bases[0]
        raise ValueError(
            f"{module}:{name} subclasses Ray Serve's {base.__module__}.{base.__qualname__}, whose "
            "private API app_toolkit does not implement; subclass app_toolkit.request_router."
            "RequestRouter instead (docs/routing.md)"
        )
    if module == "__main__" or "<locals>" in name:
        raise ValueError(
            f"{module}:{name} cannot be imported by the callers that route (each makes its own "
            "router from its import path); define the class at the top level of a module"
        )
    return f"{module}:{name}"
