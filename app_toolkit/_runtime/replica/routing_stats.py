"""A replica's routing stats: the user's ``record_routing_stats()``, for request routers.

Ray Serve's hook: a deployment class may define ``record_routing_stats(self)``, sync or
async, returning ``dict[str, Any]``. The replica calls it every
``request_router_config.request_routing_stats_period_s``, each call bounded by
``request_routing_stats_timeout_s`` (``hook_sampler.py``: one call at a time, problems
logged once and skipped), whatever its deployment's router, as Ray Serve's controller
calls it (``status()`` shows the newest result too). A result must be JSON of at most
``MAX_STATS_BYTES``: it travels in the replica tables to every caller.

The newest result waits here until the process's next load report takes it to the
controller (``TableSubscriber.add_stats``), which writes it into the replica's table
entry and republishes the table when it changed; request routers read it as
``RunningReplica.routing_stats``. A result equal to the last one taken is not sent again
for ``RESEND_S`` (an idle replica's stats change rarely); past that it is, so that a
report lost on the way, or a controller that restarted, has them again. A call that
fails leaves the last good result in place, as Ray Serve's controller keeps it.
"""

from __future__ import annotations

import asyncio
import itertools
import json

from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.replica.hook_sampler import StatsHook
from app_toolkit._runtime.tables import ReplicaRoutingStats
from app_toolkit.config import DeploymentConfig
from app_toolkit.config.request_router import RequestRouterConfig

#: The largest result taken, as compact JSON: every caller of the deployment gets each
#: replica's stats with every table (counts and a few names fit many times over).
MAX_STATS_BYTES = 4096
#: How long a result equal to the last one taken waits before it is sent again.
RESEND_S = 30.0


class RoutingStats(StatsHook):
    """Samples one replica's ``record_routing_stats()``; owns its sampler."""

    METHOD = "record_routing_stats"
    SKIPPED = "request routers keep its last stats"

    def __init__(
        self, instance: object, replica_id: str, deployment: DeploymentID, config: DeploymentConfig
    ) -> None:
        #: The newest good result, as JSON ("": none yet).
        self.latest = ""
        self._taken = ""  # the result the last take sent
        self._taken_at = float("-inf")
        self._samples = itertools.count()
        super().__init__(instance, replica_id, deployment, config)

    def take(self) -> ReplicaRoutingStats | None:
        """The newest result, if the controller should hear of it now: it changed since
        the last take, or ``RESEND_S`` passed (None: nothing to send)."""
        now = asyncio.get_running_loop().time()
        if not self.latest or (self.latest == self._taken and now - self._taken_at < RESEND_S):
            return None
        self._taken, self._taken_at = self.latest, now
        return ReplicaRoutingStats(self.replica_id, self.deployment, self.latest, next(self._samples))

    def _schedule(self) -> tuple[float, float] | None:
        routing = self.config.request_router_config or RequestRouterConfig()  # Ray's defaults
        return routing.request_routing_stats_period_s, routing.request_routing_stats_timeout_s

    def _keep(self, value: object, now: float) -> str:
        if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
            return f"returned {value!r:.60}, not a dict with string keys"
        try:
            # Sorted and compact: equal stats make equal text (a change is a text change).
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            return f"returned a dict that is not JSON ({exc})"
        if len(text.encode()) > MAX_STATS_BYTES:
            return f"returned {len(text.encode())} bytes of JSON, more than the {MAX_STATS_BYTES} allowed"
        self.latest = text
        return ""
