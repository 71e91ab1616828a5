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
from dataclasses import dataclass, field
from typing import Any

import ray
from ray._raylet import IMPLICIT_RESOURCE_PREFIX  # type: ignore[attr-defined]  # Cython: no stub for it
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from app_toolkit._runtime.controller.backend import Unplaced
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit.config import DeploymentConfig

logger = logging.getLogger("app_toolkit.ray")

#: A replica's placement group is named after the replica (``find_groups`` reads it back).
GROUP_PREFIX = "app_toolkit_group:"


@dataclass
class Placing:
    """A replica actor being started: what it asks each node for, and its group."""

    actor: Any
    asks: dict[str, float]
    per_node: int | None = None
    group: PlacementGroup | None = None
    bundles: list[dict[str, float]] = field(default_factory=list)
    strategy: str = ""


def resource_asks(config: DeploymentConfig) -> dict[str, float]:
    """What one replica's actor asks a node for, named as Ray names resources (the byte
    of memory every replica asks for is left out: it never keeps one from a node)."""
    options = config.ray_actor_options
    asks = {"CPU": options.num_cpus, "GPU": options.num_gpus, **options.resources}
    if options.memory:
        asks["memory"] = float(options.memory)
    return {name: amount for name, amount in asks.items() if amount}


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
    return f"{IMPLICIT_RESOURCE_PREFIX}app_toolkit:{deployment.app}:{deployment.name}"


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
    """Replica id -> why Ray cannot place it now, for each of ``starting`` still pending
    (``names``: its actor's name -> replica id). Blocking GCS reads (~ms): run in a thread."""
    pending = {
        names[info["Name"]]
        for info in ray._private.state.actors(actor_state_name="PENDING_CREATION").values()
        if info.get("Name") in names
    }
    if not pending:
        return {}
    state: Any = ray._private.state  # its functions are unannotated
    totals: dict[str, dict[str, float]] = {
        node: resources for node, resources in state.total_resources_per_node().items() if node not in leaving
    }
    free: dict[str, dict[str, float]] = state.available_resources_per_node()
    found: dict[str, Unplaced] = {}
    for replica_id in pending:
        placing = starting.get(replica_id)
        if placing is not None:
            why = _why(placing, totals, free)
            if why is not None:
                found[replica_id] = why
    return found


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
