"""Which local ingress replica the proxy hands a new connection to (pure, no sockets)."""

from __future__ import annotations

from collections import Counter

import pytest

from app_toolkit._runtime.front.path_match import AppMatcher
from app_toolkit._runtime.messages import DeploymentID, ReplicaInfo, RouteInfo
from app_toolkit._runtime.proxy.handoff_targets import HandoffTargets
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit.exceptions import RequestLostError

NODE = "node-a"


def _dispatcher(replicas: list[ReplicaInfo], split: bool = False) -> Dispatcher:
    """A real dispatcher with ``replicas`` as its table (and a traffic split, if asked)."""
    deployment = DeploymentID(replicas[0].deployment.app, "Ingress")
    made = Dispatcher(deployment, lambda info: None, resolve=lambda other: made, lost_error=RequestLostError)  # type: ignore[arg-type, return-value]  # never connects
    shares = ((deployment, 0.5), (DeploymentID("other", "Ingress"), 0.5)) if split else ()
    made.update(replicas, 100, split=shares)
    assert made.has_policy is split
    return made


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


def _ingresses(dispatchers: dict[str, Dispatcher]) -> HandoffTargets:
    apps = [
        AppMatcher(RouteInfo(prefix, name, DeploymentID(name, "Ingress")))
        for name, prefix in (("shop", "/shop"), ("root", "/"))
        if name in dispatchers
    ]
    apps.sort(key=lambda app: len(app.route_prefix), reverse=True)
    return HandoffTargets(lambda: apps, lambda deployment: dispatchers[deployment.app], NODE)


@pytest.mark.anyio  # a dispatcher lives on a loop
async def test_connections_go_to_this_nodes_replicas_of_the_matching_app() -> None:
    shop = _dispatcher([_replica("shop", 1), _replica("shop", 2), _replica("shop", 3, node="node-b")])
    root = _dispatcher([_replica("root", 1)])
    ingresses = _ingresses({"shop": shop, "root": root})
    assert ingresses.wanted()
    chosen = Counter(ingresses.choose("/shop/items/1") for _ in range(100))
    # Only this node's two replicas; fewest handed of two wins, so they share evenly.
    assert set(chosen) == {("shop", "/run/shop-1"), ("shop", "/run/shop-2")}
    assert all(count == 50 for count in chosen.values())
    assert ingresses.choose("/elsewhere") == ("root", "/run/root-1")
    assert ingresses.choose("/-/metrics") is None  # the proxy's own pages stay there


@pytest.mark.anyio
async def test_no_hand_off_without_a_local_replica_that_takes_connections_or_with_a_policy() -> None:
    ingresses = _ingresses(
        {
            "shop": _dispatcher([_replica("shop", 1, handoff=False), _replica("shop", 2, node="node-b")]),
            "root": _dispatcher([_replica("root", 1)], split=True),  # a split (or a shadow)
        }
    )
    assert not ingresses.wanted()
    assert ingresses.choose("/shop/x") is None
    assert ingresses.choose("/x") is None
