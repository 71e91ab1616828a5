"""Ray beyond its public API: every private name the Ray backend calls, in one place, so
that the cap in pyproject.toml (``ray>=2.52,<2.61``) has one list to check when it is
lifted (``make compat`` runs the suite on the newest Ray and says what broke).

Each entry: the internal, what the backend does with it, and the oldest release it was
checked on (the newest is the cap's). None has a public equivalent without the dashboard.

- ``global_worker.gcs_client.get_draining_nodes`` (with a timeout; 2.60 has it, 2.52 not), else
  ``ray._private.state.state.get_draining_nodes``: which nodes are leaving and when
  (``nodes.py``). Checked on 2.52.0 (the second) and 2.60.0 (the first).
- ``ray._raylet.IMPLICIT_RESOURCE_PREFIX``: the per-node resource every node has one of,
  which caps replicas per node as Ray Serve does (``placement.py``). Checked on 2.52.0.
- ``ray.autoscaler.v2.sdk.get_cluster_resource_state``: the cluster's unmet resource
  demand, to tell a replica waiting for room from one whose process starts
  (``placement.py``). Checked on 2.52.0.
- ``ray._private.state``: pending actors and each node's total and free resources
  (``placement.py``). Checked on 2.52.0.
- ``ray.experimental.internal_kv``'s ``_internal_kv_put/get/del``: the GCS key-value
  store the controller checkpoints to (``stored.py``). Checked on 2.52.0.
- ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0`` (``ENVIRONMENT``): a worker given no GPU keeps
  ``CUDA_VISIBLE_DEVICES`` as it was, Ray 2.60's default; Ray 2.52 overrides it and warns
  at ``ray.init`` unless this is set. Checked on 2.52.0.
- The text of ``ray.init``'s ``RuntimeError("Version mismatch: ...")`` (``version_skew``):
  which Ray and Python the cluster runs, to say so and what to do (``cluster.py``).
  Checked on 2.52.0 and 2.60.0.
- ``ray.cloudpickle.cloudpickle._function_setstate``: a copied function gets its module's
  globals (``codec.py``). Checked on 2.52.0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import ray
from ray._raylet import IMPLICIT_RESOURCE_PREFIX  # type: ignore[attr-defined]  # Cython: no stub for it
from ray.autoscaler.v2.sdk import get_cluster_resource_state
from ray.cloudpickle.cloudpickle import _function_setstate
from ray.experimental import internal_kv

__all__ = [
    "ENVIRONMENT",
    "IMPLICIT_RESOURCE_PREFIX",
    "available_resources_per_node",
    "draining_nodes",
    "function_setstate",
    "kv_del",
    "kv_get",
    "kv_put",
    "pending_actors",
    "pending_resource_requests",
    "total_resources_per_node",
    "version_skew",
]

#: Set (unless the user set them) before ``ray.init``, so every release in the range
#: behaves as the newest does.
ENVIRONMENT = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}


def _gcs_client() -> Any:
    worker: Any = ray._private.worker.global_worker  # its GCS client is not annotated
    return worker.gcs_client


def draining_nodes(timeout_s: float) -> dict[str, int]:
    """Node id -> its drain deadline (Unix ms; 0: none), from the GCS (blocking: call it
    in a thread)."""
    client = _gcs_client()
    if hasattr(client, "get_draining_nodes"):
        return dict(client.get_draining_nodes(timeout=timeout_s))
    state: Any = ray._private.state  # older Ray: the global state accessor (its own RPC timeout)
    return dict(state.state.get_draining_nodes())


def pending_resource_requests() -> list[tuple[dict[str, float], int]]:
    """The cluster's resource requests waiting for room: (resources, how many)."""
    state = get_cluster_resource_state(_gcs_client())
    return [
        (dict(request.request.resources_bundle), int(request.count))
        for request in state.pending_resource_requests
    ]


def pending_actors() -> list[dict[str, Any]]:
    """Actors Ray has not created yet (their name, ``Pid`` once a process has them)."""
    state: Any = ray._private.state  # its functions are unannotated
    return list(state.actors(actor_state_name="PENDING_CREATION").values())


def total_resources_per_node() -> dict[str, dict[str, float]]:
    state: Any = ray._private.state
    return dict(state.total_resources_per_node())


def available_resources_per_node() -> dict[str, dict[str, float]]:
    state: Any = ray._private.state
    return dict(state.available_resources_per_node())


def kv_put(key: bytes, data: bytes, namespace: str) -> None:
    internal_kv._internal_kv_put(key, data, overwrite=True, namespace=namespace)


def kv_get(key: bytes, namespace: str) -> bytes | None:
    data: bytes | None = internal_kv._internal_kv_get(key, namespace=namespace)
    return data


def kv_del(key: bytes, namespace: str) -> None:
    internal_kv._internal_kv_del(key, namespace=namespace)


def function_setstate(function: object, state: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """Set a copied function's globals and attributes as cloudpickle does when it loads one."""
    _function_setstate(function, state)  # type: ignore[no-untyped-call]  # cloudpickle is unannotated


@dataclass(frozen=True)
class VersionSkew:
    """The Ray and Python versions of a cluster and of the process that tried to join it."""

    cluster_ray: str
    cluster_python: str
    driver_ray: str
    driver_python: str


_MISMATCH = re.compile(
    r"Version mismatch: The cluster was started with:\s+Ray: (\S+)\s+Python: (\S+)\s+"
    r"This process .*? was started with:\s+Ray: (\S+)\s+Python: (\S+)",
    re.DOTALL,
)


def version_skew(error: BaseException) -> VersionSkew | None:
    """The versions ``ray.init`` refused to join with, if ``error`` is that refusal."""
    found = _MISMATCH.search(str(error)) if isinstance(error, RuntimeError) else None
    return VersionSkew(*found.groups()) if found is not None else None
