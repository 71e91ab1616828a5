"""What the controller follows of the cluster: nodes that are leaving (Ray drains them)
and replica starts the cluster cannot place. Once a second it asks the backend
(``cluster_view``); what changed becomes events for the deployments, and a leaving node
that runs none of our replicas anymore is released (its proxy and spares stop, the node
can go)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from app_toolkit._runtime.controller.backend import Backend, ClusterView, Unplaced
from app_toolkit._runtime.controller.deployment_state import DeploymentState, Leaving, apply_event
from app_toolkit._runtime.controller.replica_state import Placement
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit.status import ReplicaState

logger = logging.getLogger("app_toolkit.controller")

#: How often the cluster is asked which nodes are leaving and which starts wait for room.
PERIOD_S = 1.0
#: What a start the backend knows of, and does not say waits, is: placed, or starting.
_PLACED = Unplaced("")


class Records(Protocol):
    """What the controller keeps that the cluster's news changes."""

    deployments: dict[DeploymentID, DeploymentState]

    def replan(self, deployment: DeploymentID | None = None) -> None:
        """Plan ``deployment`` (None: every one) on the next pass, and wake the loop."""
        ...


class ClusterWatch:
    """Leaving nodes (``draining``: node id -> since when and until when, on the
    controller's clock) and
    placement news, kept for one controller. Its question to the backend runs as a task
    of the controller's (``spawn``), one at a time."""

    def __init__(
        self,
        backend: Backend[Any],
        records: Records,
        record: Callable[[int, str], None],
        spawn: Callable[[Any], None],
    ) -> None:
        self._backend = backend
        self._records = records
        self._record = record
        self._spawn = spawn
        self.draining: dict[str, Leaving] = {}
        self._released: set[str] = set()  # leaving nodes told that none of our replicas run there
        self._asked_at = -float("inf")
        self._asking = False

    def follow(self) -> None:
        """Ask the backend again if ``PERIOD_S`` has passed and no question is under way."""
        now = asyncio.get_running_loop().time()
        if now - self._asked_at < PERIOD_S or self._asking:
            return
        self._asked_at, self._asking = now, True
        self._spawn(self._ask())

    async def _ask(self) -> None:
        try:
            view = await self._backend.cluster_view()
        except Exception:
            logger.exception("Asking the cluster which nodes leave failed; asking again")
            return
        finally:
            self._asking = False
        self.seen(view)

    def seen(self, view: ClusterView) -> None:
        """Take what the cluster said: leaving nodes (their replicas move), and why
        starting replicas wait (an upgrade may then go in steps). A replica placed since
        (its node known) is past waiting, whatever an older view says."""
        now = asyncio.get_running_loop().time()
        draining = {
            node: Leaving(self.draining[node].since if node in self.draining else now, now + left)
            for node, left in view.draining.items()
        }
        if draining.keys() != self.draining.keys():
            for node in draining.keys() - self.draining.keys():
                self._record(logging.WARNING, f"Node {node[:12]} is leaving: moving its replicas")
            self._records.replan()
        self.draining = draining
        self._released &= draining.keys()
        for deployment_id, state in self._records.deployments.items():
            for replica in list(state.replicas.values()):
                if (
                    replica.replica_id not in view.starting
                    or replica.state is not ReplicaState.STARTING
                    or replica.stop_requested
                    or replica.node_id
                ):
                    continue
                seen = view.unplaced.get(replica.replica_id, _PLACED)
                if (seen.reason, seen.infeasible) != (replica.unplaced, replica.infeasible):
                    apply_event(state, replica.replica_id, Placement(seen.reason, seen.infeasible), now)
                    self._records.replan(deployment_id)

    def release(self) -> None:
        """Tell the backend about each leaving node that none of our replicas run on
        anymore (once), so what else of ours runs there stops and the node can go."""
        for node in self.draining.keys() - self._released:
            replicas = (r for state in self._records.deployments.values() for r in state.replicas.values())
            if not any(r.node_id == node for r in replicas):
                self._released.add(node)
                self._spawn(self._backend.release_node(node))
