"""Autoscaling end to end: from zero on the first request, up with load, down to zero,
draining in-flight work; nothing fails along the way."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import app_toolkit as tk
from tests import plain_http
from tests.apps import scaling
from tests.conftest import Toolkit
from tests.waiting import wait_for


def test_from_zero_up_with_load_and_back_to_zero_without_failures(toolkit: Toolkit) -> None:
    name = toolkit.name()
    toolkit.run(scaling.make_app(), name=name, route_prefix="/scale")

    def ingress() -> tk.DeploymentStatusInfo:
        return tk.status().applications[name].deployments["Ingress"]

    assert ingress().target_replicas == 0 and ingress().replicas == []
    with toolkit.client() as client:  # the first request waits for the first replica
        assert client.get("/scale/work", params={"seconds": 0}).status_code == 200
    assert ingress().target_replicas >= 1

    statuses: list[int] = []

    async def load(concurrency: int, seconds: float, until: Callable[[], bool]) -> None:
        async with toolkit.async_client() as client:

            async def worker() -> None:
                while not until():
                    response = await client.get("/scale/work", params={"seconds": seconds})
                    statuses.append(response.status_code)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    # 6 requests always in flight at 2 per replica: 3 replicas (max_replicas).
    deadline = time.monotonic() + 40
    asyncio.run(load(6, 0.3, lambda: ingress().running_replicas >= 3 or time.monotonic() > deadline))
    scaled = ingress()
    assert scaled.running_replicas == 3, scaled
    assert scaled.autoscaling is not None and scaled.autoscaling.last_decision_to is not None
    assert scaled.autoscaling.last_decision_load is not None and scaled.autoscaling.last_decision_load > 2

    # Load stops, except one long request that must finish even if its replica is removed.
    async def long_request() -> int:
        async with toolkit.async_client() as client:
            return (await client.get("/scale/work", params={"seconds": 4})).status_code

    long_status = asyncio.run(long_request())
    wait_for(lambda: ingress().target_replicas == 0 and not ingress().replicas, 40, "scale to zero")
    assert long_status == 200
    assert statuses and set(statuses) == {200}, f"{statuses.count(200)} ok of {len(statuses)}"

    with toolkit.client() as client:  # and from zero once more
        assert client.get("/scale/work", params={"seconds": 0}).status_code == 200


def test_num_replicas_auto_and_conflicting_options() -> None:
    config = tk.deployment(num_replicas="auto")(lambda: None).config
    assert config.autoscaling_config is not None and config.initial_replicas == 1
    try:
        tk.deployment(num_replicas=2, autoscaling_config={"max_replicas": 3})(lambda: None)
    except tk.ConfigError as exc:
        assert "either num_replicas or autoscaling_config" in str(exc)
    else:
        raise AssertionError("both num_replicas and autoscaling_config were accepted")
    moved = tk.deployment(num_replicas="auto")(lambda: None).options(num_replicas=2)
    assert moved.config.autoscaling_config is None and moved.config.num_replicas == 2


def test_status_explains_the_last_decision(toolkit: Toolkit) -> None:
    name = toolkit.name()
    toolkit.run(scaling.make_app(min_replicas=1), name=name, route_prefix="/explain")
    info = tk.status().applications[name].deployments["Ingress"]
    assert info.autoscaling is not None and info.autoscaling.last_decision_to is None
    data = tk.status().to_dict()["applications"][name]["deployments"]["Ingress"]
    assert set(data["autoscaling"]) >= {
        "current_load",
        "average_load",
        "last_decision_load",
        "last_decision_age_s",
    }
    plain_http.get(toolkit.url + "/explain/work", params={"seconds": 0}, timeout=30).raise_for_status()


def test_requests_on_connections_a_replica_owns_count_as_its_load(toolkit: Toolkit) -> None:
    """Direct ingress: kept-alive clients end up on connections the ingress replica owns,
    where no proxy's dispatcher sees their requests. With room for all of them on one
    replica (nothing is forwarded), the autoscaler must still see them and scale up."""
    name = toolkit.name()
    roomy = {**scaling.FAST_SCALING, "min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 2}
    app = tk.App(scaling.router, name="scaling", autoscaling_config=roomy, max_ongoing_requests=100)
    toolkit.run(app, name=name, route_prefix="/roomy")

    def ingress() -> tk.DeploymentStatusInfo:
        return tk.status().applications[name].deployments["Ingress"]

    async def load() -> None:
        deadline = time.monotonic() + 40
        async with toolkit.async_client() as client:  # 6 kept-alive connections, always busy

            async def worker() -> None:
                while ingress().running_replicas < 3 and time.monotonic() < deadline:
                    response = await client.get("/roomy/work", params={"seconds": 0.3})
                    assert response.status_code == 200

            await asyncio.gather(*(worker() for _ in range(6)))

    asyncio.run(load())
    assert ingress().running_replicas == 3, ingress()  # 6 in flight at 2 per replica
