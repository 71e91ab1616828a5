"""Weighted traffic splits: the controller's checks and what it publishes (a fake
backend), and how callers apply a split (fake replicas): shares, stickiness by key."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from app_toolkit._runtime.controller.controller import ControllerCore
from app_toolkit._runtime.controller.traffic import endpoint_of, normalize, split_for, without
from app_toolkit._runtime.messages import AppSpec, DeploymentID, ReplicaInfo
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit._runtime.tables import ReplicaTable, replicas_key
from app_toolkit.exceptions import ConfigError, RequestLostError
from tests.unit.test_controller import FakeBackend, app, started, until
from tests.unit.test_dispatcher import FakeReplica, answer, call

V1, V2 = DeploymentID("v1", "D"), DeploymentID("v2", "D")


def _apps(*names: str) -> dict[str, AppSpec]:
    return {name: app(name) for name in names}


def test_weights_are_checked_and_scaled() -> None:
    apps = _apps("v1", "v2", "x")
    assert normalize("v1", {"v1": 90, "v2": 10}, apps) == (("v1", 0.9), ("v2", 0.1))
    assert normalize("v1", {"v1": 0.5, "v2": 0.5, "x": 0}, apps) == (("v1", 0.5), ("v2", 0.5))
    assert normalize("v1", {"v1": 3}, apps) == ()  # everything to itself: no split
    for weights, message in (
        ({"v3": 1}, "no such application"),
        ({"v2": -1}, "must not be negative"),
        ({"v2": 0}, "above zero"),
        ({"v2": "ten"}, "must be a number"),
        ({"v2": float("nan")}, "must be a number"),
        ({}, "at least one application"),
    ):
        with pytest.raises(ConfigError, match=message):
            normalize("v1", weights, apps)  # type: ignore[arg-type] # bad on purpose
    with pytest.raises(ConfigError, match="deploy it first"):
        normalize("nope", {"v1": 1}, apps)


def test_a_deleted_application_leaves_every_split() -> None:
    traffic = {"v1": (("v1", 0.8), ("v2", 0.2)), "v2": (("v2", 0.5), ("v3", 0.5)), "x": (("v1", 1.0),)}
    assert without(traffic, "v2") == {"x": (("v1", 1.0),)}  # v1 keeps it all: no split left
    assert without(traffic, "v3") == {"v1": (("v1", 0.8), ("v2", 0.2)), "x": (("v1", 1.0),)}


@pytest.mark.anyio
async def test_the_controller_publishes_the_split_and_keeps_it_across_a_restart() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app("v1", prefix="/chat")])
    await core.deploy_apps([app("v2", prefix=None)])
    await until(lambda: len(backend.running) == 4)
    await core.set_traffic("v1", {"v1": 90, "v2": 10})
    table = core.longpoll.get(replicas_key(V1))
    assert isinstance(table, ReplicaTable) and table.split == ((V1, 0.9), (V2, 0.1))
    assert core.snapshot().applications["v1"].traffic == {"v1": 0.9, "v2": 0.1}
    assert any("Traffic of v1: v1 90.0%, v2 10.0%" in e.message for e in core.snapshot().events)
    with pytest.raises(ConfigError, match="no such application"):
        await core.set_traffic("v1", {"v9": 1})
    # A restarted controller serves the same split (it is in the checkpoint).
    restarted = ControllerCore(backend)
    await restarted.start()
    again = restarted.longpoll.get(replicas_key(V1))
    assert isinstance(again, ReplicaTable) and again.split == ((V1, 0.9), (V2, 0.1))
    await restarted.stop()
    # Deleting a variant ends its share at once.
    await core.delete_app("v2")
    table = core.longpoll.get(replicas_key(V1))
    assert isinstance(table, ReplicaTable) and table.split == ()
    await core.stop()


def ControllerCoreFrom(backend: FakeBackend) -> ControllerCore:
    from app_toolkit._runtime.controller.controller import ControllerCore

    return ControllerCore(backend)


def _split_dispatchers(
    shares: tuple[tuple[DeploymentID, float], ...],
) -> tuple[Dispatcher, dict[DeploymentID, Dispatcher]]:
    made: dict[DeploymentID, Dispatcher] = {}

    def resolve(deployment: DeploymentID) -> Dispatcher:
        if deployment not in made:
            replica = FakeReplica(f"{deployment.app}-r", answer)
            made[deployment] = Dispatcher(
                deployment, lambda _: replica, resolve=resolve, lost_error=RequestLostError
            )
            made[deployment].update([ReplicaInfo(replica.replica_id, deployment, "h", 1, b"t", 10_000)], 100)
        return made[deployment]

    endpoint = resolve(V1)
    endpoint.update([ReplicaInfo("v1-r", V1, "h", 1, b"t", 10_000)], 100, split=shares)
    return endpoint, made


@pytest.mark.anyio
async def test_ten_thousand_requests_land_within_two_percent_of_the_weights() -> None:
    endpoint, _ = _split_dispatchers(((V1, 0.9), (V2, 0.1)))
    landed: Counter[str] = Counter()
    for n in range(10_000):
        reply = await endpoint.send(call(n))
        landed[reply.replica_id] += 1
        reply.release()
    assert abs(landed["v1-r"] / 10_000 - 0.9) <= 0.02 and abs(landed["v2-r"] / 10_000 - 0.1) <= 0.02


@pytest.mark.anyio
async def test_a_shard_key_sees_one_variant_while_the_weights_stay() -> None:
    endpoint, _ = _split_dispatchers(((V1, 0.5), (V2, 0.5)))
    first: dict[str, str] = {}
    for _ in range(3):
        for key in (f"user-{i}" for i in range(200)):
            reply = await endpoint.send(call(key), shard_key=key)
            assert first.setdefault(key, reply.replica_id) == reply.replica_id
            reply.release()
    assert 60 <= Counter(first.values())["v2-r"] <= 140  # and keys spread by the weights


def test_a_deployment_s_calls_split_between_deployments_of_its_app() -> None:
    spec = app("shop")
    model, model_v2 = (
        spec.deployments[0],
        dataclasses.replace(spec.deployments[0], id=DeploymentID("shop", "D2")),
    )
    two = dataclasses.replace(spec, ingress="Ingress", deployments=(model, model_v2))
    apps = {"shop": two, "other": app("other")}
    assert endpoint_of("shop/D", apps) == DeploymentID("shop", "D")
    assert normalize("shop/D", {"D": 90, "D2": 10}, apps) == (("D", 0.9), ("D2", 0.1))
    assert normalize("shop/D", {"D": 1}, apps) == ()
    assert split_for("shop/D", (("D", 0.9), ("D2", 0.1)), apps) == (
        (DeploymentID("shop", "D"), 0.9),
        (DeploymentID("shop", "D2"), 0.1),
    )
    for endpoint, weights, message in (
        ("shop/Nope", {"D": 1}, "has no deployment 'Nope'"),
        ("shop/D", {"other": 1}, "no such deployment of 'shop'"),
        ("shop/Ingress", {"D": 1}, "split the application, 'shop'"),
    ):
        with pytest.raises(ConfigError, match=message):
            normalize(endpoint, weights, apps)
    with pytest.raises(ConfigError, match="split the application, 'other'"):
        normalize("other/D", {"D": 1}, apps)
    # A variant removed by a redeploy: the others share its weight.
    one = dataclasses.replace(two, deployments=(model,))
    assert split_for("shop/D", (("D", 0.5), ("D2", 0.5)), {"shop": one}) == (
        (DeploymentID("shop", "D"), 1.0),
    )
    assert without({"shop/D": (("D", 0.5), ("D2", 0.5))}, "shop") == {}
