"""Which of the node's ingress replicas a client connection is handed to: the proxy's
table of them (the acceptor's :class:`~app_toolkit._runtime.proxy.acceptor.HandoffRoutes`),
read from the tables it subscribes to. Proxy-process code.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from app_toolkit._runtime.front.key_check import KeyRing
from app_toolkit._runtime.front.path_match import AppMatcher, match_app
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.routing.dispatcher import Dispatcher

# How long the acceptor trusts "some local replica takes connections" (and "none does":
# briefly, so the first replica of a new app gets connections at once).
_WANTED_FOR_S = 1.0
_UNWANTED_FOR_S = 0.1
_FADE_EVERY_S = 1.0  # how often the counts of recent hand-offs halve


class HandoffTargets:
    """The node's ingress replicas that take client connections, as the proxy's tables
    show them: the acceptor's :class:`~app_toolkit._runtime.proxy.acceptor.HandoffRoutes`.

    An application whose ingress has a traffic policy (a split, a shadow) keeps its
    connections in the proxy, which decides per request. Among the local replicas of an
    application, the one that was handed fewer connections lately of two drawn at random
    wins.
    """

    def __init__(
        self,
        apps: Callable[[], list[AppMatcher]],
        dispatcher_for: Callable[[DeploymentID], Dispatcher],
        node_id: str,
        keys: KeyRing | None = None,
    ) -> None:
        self._apps = apps
        self._keys = keys
        self._dispatcher_for = dispatcher_for
        self._node_id = node_id
        self._handed: dict[str, int] = {}  # hand-off path -> connections handed
        self._wanted = False
        self._wanted_until = 0.0
        self._fade_at = 0.0
        self._rng = random.Random()

    def _candidates(self, app: AppMatcher) -> tuple[str, ...]:
        dispatcher = self._dispatcher_for(app.ingress)
        return () if dispatcher.has_policy else dispatcher.handoffs(self._node_id)

    def wanted(self) -> bool:
        now = time.monotonic()
        if now >= self._wanted_until:
            self._wanted = any(self._candidates(app) for app in self._apps())
            self._wanted_until = now + (_WANTED_FOR_S if self._wanted else _UNWANTED_FOR_S)
        if now >= self._fade_at:
            # Recent hand-offs count, old ones fade (a replica that joins late is not
            # handed every new connection until it has caught up with the others).
            self._fade_at = now + _FADE_EVERY_S
            self._handed = {path: count // 2 for path, count in self._handed.items() if count > 1}
        return self._wanted

    def opens(self, head: bytes) -> bool:
        return self._keys is None or self._keys.opens(head)

    def choose(self, path: str) -> tuple[str, str] | None:
        app = match_app(self._apps(), path)
        if app is None:
            return None
        candidates = self._candidates(app)
        if not candidates:
            return None
        if len(candidates) > 1:
            candidates = tuple(self._rng.sample(candidates, 2))
        handed = self._handed
        chosen = min(candidates, key=lambda candidate: handed.get(candidate, 0))
        handed[chosen] = handed.get(chosen, 0) + 1
        return app.app, chosen
