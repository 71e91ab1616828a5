"""Ray Serve options with no counterpart here, and the one rule that handles them.

Each is accepted only at a value that means "not used" (what ``serve build`` writes
when nobody set it) and then dropped; any other value fails naming the field and what to
do instead, never silently ignored. Code and config files share the table: each option
schema calls :func:`drop_ray_serve_only` on its input before validating it. Ray Serve
LLM's options have their own table (``app_toolkit/llm/refused.py``) under the same rule,
:func:`drop_refused`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from app_toolkit.config.schema import field_errors

Neutral = Callable[[object], bool]


def one_of(*values: object) -> Neutral:
    """Neutral when equal to one of ``values`` and of the same type (``0`` is not ``False``)."""
    return lambda value: any(type(value) is type(v) and value == v for v in values)


def defaults(**fields: tuple[object, ...]) -> Neutral:
    """Neutral when None, or a mapping whose every key is in ``fields`` with one of its values."""

    def neutral(value: object) -> bool:
        if value is None:
            return True
        return isinstance(value, Mapping) and all(
            key in fields and one_of(*fields[key])(item) for key, item in value.items()
        )

    return neutral


def disabled(value: object) -> bool:
    """Neutral when None or turned off (``enabled: false``; its other fields then mean nothing)."""
    return value is None or (isinstance(value, Mapping) and value.get("enabled") is False)


@dataclass(frozen=True)
class RayServeOnly:
    """A Ray Serve option not implemented here: when it means nothing, and what to do."""

    neutral: Neutral
    instead: str


_NO_LABELS = (
    "label selectors are not implemented; remove it, give the chosen nodes a custom "
    "resource (ray start --resources) and ask for it in "
)

#: Per schema ("kind"), the Ray Serve fields it accepts only at their neutral value.
RAY_SERVE_ONLY: dict[str, dict[str, RayServeOnly]] = {
    "file": {
        "controller_options": RayServeOnly(
            defaults(runtime_env=(None, {})),
            "the controller reads no RAY_SERVE_* environment variables; remove it (a "
            "deployment's environment goes in its ray_actor_options.runtime_env)",
        ),
        "tracing_config": RayServeOnly(
            disabled,
            "remove it (or set enabled: false) and export spans with "
            "APP_TOOLKIT_OTEL_SETUP=module:function (docs/observability.md)",
        ),
    },
    # http: Ray Serve's ssl_* fields are taken (config/client_tls.py).
    "http": {},
    "grpc": {
        "grpc_servicer_functions": RayServeOnly(
            one_of([]), "gRPC is not served; remove the servicer functions and serve over HTTP"
        ),
    },
    "application": {
        "host": RayServeOnly(one_of(None), "remove it and set http_options.host at the top of the file"),
        "port": RayServeOnly(one_of(None), "remove it and set http_options.port at the top of the file"),
        "external_scaler_enabled": RayServeOnly(
            one_of(False),
            "there is no external scaling API; remove it and set num_replicas (a "
            "redeploy) or autoscaling_config",
        ),
    },
    "deployment": {
        "placement_group_bundle_label_selector": RayServeOnly(
            one_of(None, []), _NO_LABELS + "placement_group_bundles"
        ),
        "gang_scheduling_config": RayServeOnly(
            one_of(None),
            "gang scheduling is not implemented; remove it (placement_group_bundles with "
            "placement_group_strategy STRICT_PACK reserve one replica's resources together)",
        ),
        "deployment_actors": RayServeOnly(
            one_of(None, []),
            "deployment-scoped actors are not implemented; remove them and create a named "
            "Ray actor yourself (ray.get_actor in the replica's constructor)",
        ),
    },
    "logging": {
        "logs_dir": RayServeOnly(
            one_of(None),
            "logs go to standard error (on Ray, each worker's is kept in Ray's session "
            "logs directory: docs/observability.md); remove it",
        ),
        "additional_log_standard_attrs": RayServeOnly(
            one_of([], None),
            "log lines carry the request, replica and route, not other record attributes; "
            "remove it (or set it to [])",
        ),
    },
    "ray_actor_options": {
        "label_selector": RayServeOnly(one_of(None, {}), _NO_LABELS + "ray_actor_options.resources"),
        "fallback_strategy": RayServeOnly(
            one_of(None, []),
            "fallback strategies are not implemented; remove it and ask for the resources "
            "every node that may run the replica has",
        ),
    },
}

T = TypeVar("T")

#: What a refused field is called in its error, before what to do instead.
NOT_IMPLEMENTED = "a Ray Serve option app_toolkit does not implement"


def drop_ray_serve_only(kind: str, data: T) -> T | dict[str, object]:
    """``data`` without the Ray Serve-only fields of ``kind`` left at their neutral value;
    any other value raises a ``ValidationError`` located at the field. (Anything but a
    mapping is left for the schema to refuse.)"""
    return drop_refused(kind, data, RAY_SERVE_ONLY[kind])


def drop_refused(
    title: str, data: T, table: Mapping[str, RayServeOnly], what: str = NOT_IMPLEMENTED
) -> T | dict[str, object]:
    """``data`` without the fields of ``table`` left at their neutral value; any other
    value raises a ``ValidationError`` located at the field, saying ``what`` it is and
    what to do instead. (Anything but a mapping is left for the schema to refuse.)"""
    if not isinstance(data, Mapping):
        return data
    kept: dict[str, object] = dict(data)
    refused: dict[str | tuple[str, ...], tuple[object, str]] = {}
    for field, option in table.items():
        if field not in kept:
            continue
        value = kept.pop(field)
        if not option.neutral(value):
            refused[field] = (value, f"{what}: {option.instead}")
    if refused:
        raise field_errors(title, refused)
    return kept
