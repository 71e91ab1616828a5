"""Where a replica's actor goes on Ray, and why Ray cannot place one yet.

- ``actor_placement``: the resources and scheduling strategy of a replica's actor: spread
  over nodes; with ``max_replicas_per_node``, a per-node resource every node has one of
  (Ray core's implicit resources, as Ray Serve caps replicas per node), a 1/N share of it
  per replica; with ``placement_group_bundles``, a placement group of its own (named after
  the replica, detached, so a restarted controller finds it), the actor in its first
  bundle and the tasks and actors it starts in the group.
- ``unplaced``: for replicas being started, what the cluster lacks to place each one,
  from the GCS (pending actors and placement groups, each node's total and free
  resources); no dashboard needed.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from app_toolkit._runtime.backends.ray import ray_compat
from app_toolkit._runtime.controller.backend import Unplaced
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit.config import DeploymentConfig

logger = logging.getLogger("app_toolkit.ray")

#: A replica's placement group is named after the replica (``find_group`` reads it back).
GROUP_PREFIX = "app_toolkit_group:"


@dataclass
class Placing:
    """A replica actor being started: what it asks each node for (``asks``: as the
    replica's options say; ``shape``: the resource request Ray schedules, the per-node
    cap and the byte of memory included), and its group."""

    actor: Any
    asks: dict[str, float]
    shape: dict[str, float]
    per_node: int | None = None
    group: PlacementGroup | None = None
    bundles: list[dict[str, float]] = field(default_factory=list)
    strategy: str = ""


def request_shape(placed: dict[str, Any]) -> dict[str, float]:
    """The resource request Ray makes of an actor with options ``placed`` (as its
    demand reports name it)."""
    shape = {"CPU": placed.get("num_cpus") or 0, "GPU": placed.get("num_gpus") or 0, **placed["resources"]}
    shape["memory"] = placed.get("memory") or 0
    return _rounded(shape)


def _rounded(resources: dict[str, float]) -> dict[str, float]:
    return {name: round(float(amount), 6) for name, amount in resources.items() if amount}


def actor_placement(
    replica_id: str, deployment: DeploymentID, config: DeploymentConfig
) -> tuple[dict[str, Any], PlacementGroup | None]:
    """The Ray actor options that place a replica (resources and scheduling strategy),
    and the placement group made for it (None without ``placement_group_bundles``)."""
    options = config.ray_actor_options
    resources = dict(options.resources)
    if config.max_replicas_per_node is not None:
        resources[per_node_resource(deployment)] = 1.0 / config.max_replicas_per_node
    placed: dict[str, Any] = {
        "num_cpus": options.num_cpus,
        "num_gpus": options.num_gpus,
        "resources": resources,
        # Ray ignores the strategy (random node) for actors that request no resources at
        # all (ray-project/ray#25360); one byte of memory makes the request non-empty.
        "memory": options.memory if options.memory else 1,
        # Replicas of a deployment on different nodes: losing one node loses only some.
        "scheduling_strategy": "SPREAD",
    }
    bundles = config.placement_group_bundles
    group = None
    if bundles is not None:
        placed["memory"] = options.memory  # the byte above would not fit a bundle without memory
        group = placement_group(
            [dict(bundle) for bundle in bundles],
            strategy=config.placement_group_strategy or "PACK",
            name=GROUP_PREFIX + replica_id,
            lifetime="detached",
        )
        placed["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=group,
            placement_group_bundle_index=0,
            placement_group_capture_child_tasks=True,
        )
    return placed, group


def per_node_resource(deployment: DeploymentID) -> str:
    """The implicit resource every node has one of, shared by a deployment's replicas."""
    return f"{ray_compat.IMPLICIT_RESOURCE_PREFIX}app_toolkit:{deployment.app}:{deployment.name}"


def remove_group(group: PlacementGroup | None) -> None:
    """Release a replica's placement group (what its actor and children reserved)."""
    if group is None:
        return
    try:
        ray.util.remove_placement_group(group)
    except Exception as exc:  # noqa: BLE001 - already gone (removed by a restarted controller)
        logger.debug("Removing a placement group failed: %s", exc)


def find_group(replica_id: str) -> PlacementGroup | None:
    """The placement group a previous controller made for ``replica_id``, if any."""
    try:
        group: PlacementGroup = ray.util.get_placement_group(GROUP_PREFIX + replica_id)
    except ValueError:
        return None
    return group


def orphan_groups(kept: set[str]) -> list[PlacementGroup]:
    """Placement groups of replicas that no longer exist (their controller died while it
    started or stopped them): every group of ours not named after a replica in ``kept``."""
    orphans = []
    for info in placement_group_table().values():
        name = str(info.get("name", ""))
        if name.startswith(GROUP_PREFIX) and info.get("state") != "REMOVED":
            if name[len(GROUP_PREFIX) :] not in kept:
                orphans.append(ray.util.get_placement_group(name))
    return orphans


def unplaced(starting: dict[str, Placing], names: dict[str, str], leaving: set[str]) -> dict[str, Unplaced]:
    """Replica id -> why Ray cannot place it now, for each of ``starting`` that waits for
    resources (``names``: its actor's name -> replica id). Blocking GCS reads (~ms): run
    in a thread.

    Waiting for resources, not merely pending: an actor Ray has given resources stays
    ``PENDING_CREATION`` while its process starts. Such an actor has a process id, or no
    longer counts in the cluster's unmet demand (which the raylets report about once a
    second): of the actors of one shape without a process, as many wait as that demand says.
    """
    waiting_shapes = _unmet_demand()
    pending = []
    for info in ray_compat.pending_actors():
        replica_id = names.get(info.get("Name", ""))
        placing = starting.get(replica_id) if replica_id is not None else None
        if replica_id is None or placing is None or info.get("Pid"):
            continue
        if placing.group is None:
            shape = tuple(sorted(placing.shape.items()))
            if not waiting_shapes[shape]:
                continue  # given its resources: starting
            waiting_shapes[shape] -= 1
        pending.append(replica_id)
    if not pending:
        return {}
    totals = {
        node: resources
        for node, resources in ray_compat.total_resources_per_node().items()
        if node not in leaving
    }
    free = ray_compat.available_resources_per_node()
    found: dict[str, Unplaced] = {}
    for replica_id in pending:
        why = _why(starting[replica_id], totals, free)
        if why is not None:
            found[replica_id] = why
    return found


def _unmet_demand() -> Counter[tuple[tuple[str, float], ...]]:
    """The cluster's resource requests that wait for room, by shape, as the GCS knows them."""
    demand: Counter[tuple[tuple[str, float], ...]] = Counter()
    for resources, count in ray_compat.pending_resource_requests():
        shape = _rounded(resources)
        demand[tuple(sorted(shape.items()))] += count
    return demand


def _why(
    placing: Placing, totals: dict[str, dict[str, float]], free: dict[str, dict[str, float]]
) -> Unplaced | None:
    """Why a pending replica actor is not placed (None: nothing the cluster lacks, e.g. its
    process is starting)."""
    if placing.group is not None:
        table = placement_group_table(placing.group)
        if table.get("state") == "CREATED":
            return None
        infeasible = table.get("stats", {}).get("scheduling_state") == "INFEASIBLE"
        what = f"placement group {placing.bundles} ({placing.strategy})"
        lacks = "no nodes can hold it" if infeasible else "not enough free now"
        return Unplaced(f"{what}: {lacks}", infeasible)
    asks = placing.asks
    shown = asks or {"memory": 1.0}

    def fits(resources: dict[str, float]) -> bool:
        return all(resources.get(name, 0.0) >= amount for name, amount in asks.items())

    if not any(fits(total) for total in totals.values()):
        return Unplaced(f"needs {shown}: no node has that much", infeasible=True)
    if not any(fits(free.get(node, {})) for node in totals):
        return Unplaced(f"needs {shown}: none free")
    if placing.per_node is not None:
        return Unplaced(f"max_replicas_per_node={placing.per_node}: every node with room has that many")
    return None
