"""Which local ingress replica the proxy hands a new connection to (pure, no sockets)."""

from __future__ import annotations

from collections import Counter
from typing import cast

from app_toolkit._runtime.messages import DeploymentID, ReplicaInfo, RouteInfo
from app_toolkit._runtime.proxy.direct import LocalIngresses
from app_toolkit._runtime.proxy.path_match import AppMatcher
from app_toolkit._runtime.routing.dispatcher import Dispatcher

NODE = "node-a"


class _Dispatcher:
    def __init__(self, replicas: list[ReplicaInfo], has_policy: bool = False) -> None:
        self._replicas = replicas
        self.has_policy = has_policy

    def replicas(self) -> list[ReplicaInfo]:
        return self._replicas


def _replica(app: str, number: int, node: str = NODE, handoff: bool = True) -> ReplicaInfo:
    return ReplicaInfo(
        f"{app}-{number}",
        DeploymentID(app, "Ingress"),
        "127.0.0.1",
        1000 + number,
        b"t",
        100,
        node_id=node,
        handoff=f"/run/{app}-{number}" if handoff else "",
    )


def _ingresses(dispatchers: dict[str, _Dispatcher]) -> LocalIngresses:
    apps = [
        AppMatcher(RouteInfo(prefix, name, DeploymentID(name, "Ingress")))
        for name, prefix in (("shop", "/shop"), ("root", "/"))
        if name in dispatchers
    ]
    apps.sort(key=lambda app: len(app.route_prefix), reverse=True)
    return LocalIngresses(
        lambda: apps,
        # A stand-in with the two members used.
        lambda deployment: cast(Dispatcher, dispatchers[deployment.app]),
        NODE,
    )


def test_connections_go_to_this_nodes_replicas_of_the_matching_app() -> None:
    shop = _Dispatcher([_replica("shop", 1), _replica("shop", 2), _replica("shop", 3, node="node-b")])
    root = _Dispatcher([_replica("root", 1)])
    ingresses = _ingresses({"shop": shop, "root": root})
    assert ingresses.wanted()
    chosen = Counter(ingresses.choose("/shop/items/1") for _ in range(100))
    # Only this node's two replicas; fewest handed of two wins, so they share evenly.
    assert set(chosen) == {("shop", "/run/shop-1"), ("shop", "/run/shop-2")}
    assert all(count == 50 for count in chosen.values())
    assert ingresses.choose("/elsewhere") == ("root", "/run/root-1")
    assert ingresses.choose("/-/metrics") is None  # the proxy's own pages stay there


def test_no_hand_off_without_a_local_replica_that_takes_connections_or_with_a_policy() -> None:
    ingresses = _ingresses(
        {
            "shop": _Dispatcher([_replica("shop", 1, handoff=False), _replica("shop", 2, node="node-b")]),
            "root": _Dispatcher([_replica("root", 1)], has_policy=True),  # a split or shadow
        }
    )
    assert not ingresses.wanted()
    assert ingresses.choose("/shop/x") is None
    assert ingresses.choose("/x") is None
