"""Deploy failures are reported with their message; other apps keep serving."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import app_toolkit as tk
from tests import plain_http
from tests.apps import basic
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for


def test_failing_lifespan_fails_the_deploy_with_its_message(toolkit: Toolkit) -> None:
    healthy = toolkit.name()
    toolkit.run(basic.make_app(), name=healthy, route_prefix="/healthy")
    broken = toolkit.name()
    with pytest.raises(RuntimeError, match="database unreachable") as failed:  # as in Ray Serve
        toolkit.run(basic.make_failing_app(), name=broken, route_prefix="/broken")
    assert isinstance(failed.value, tk.DeployError)
    app = tk.status().applications[broken]
    assert app.status is tk.ApplicationStatus.DEPLOY_FAILED
    assert "database unreachable" in app.deployments["Ingress"].message
    with toolkit.client() as client:
        assert client.get("/healthy/items/3").status_code == 200


def test_failing_constructor_fails_the_deploy(toolkit: Toolkit) -> None:
    with pytest.raises(RuntimeError, match="ValueError: model file missing") as failed:
        toolkit.run(as_deployment(basic.BrokenConstructor).bind(), route_prefix="/ctor")
    assert isinstance(failed.value, tk.DeployError)


def test_redeploy_replaces_replicas_with_the_new_version(toolkit: Toolkit) -> None:
    name = toolkit.name()
    toolkit.run(basic.make_app(), name=name, route_prefix="/v")
    before = {r.replica_id for r in tk.status().applications[name].deployments["Ingress"].replicas}
    toolkit.run(basic.make_app(num_replicas=1, max_ongoing_requests=7), name=name, route_prefix="/v")
    after = tk.status().applications[name].deployments["Ingress"]
    assert after.status is tk.DeploymentStatus.HEALTHY
    assert {r.replica_id for r in after.replicas}.isdisjoint(before)
    with toolkit.client() as client:
        assert client.get("/v/items/2").status_code == 200


def test_route_prefix_conflict_is_an_error(toolkit: Toolkit) -> None:
    first = toolkit.name()
    toolkit.run(basic.make_app(), name=first, route_prefix="/same")
    with pytest.raises(tk.ConfigError, match=f"already used by application '{first}'"):
        toolkit.run(basic.make_app(), name=toolkit.name(), route_prefix="/same")


def test_delete_drains_requests_in_flight(toolkit: Toolkit, tmp_path: Path) -> None:
    name = toolkit.name()
    toolkit.run(basic.make_app(), name=name, route_prefix="/drain")
    started = tmp_path / "started"
    results: list[int] = []

    def slow_request() -> None:
        response = plain_http.get(
            toolkit.url + "/drain/sleep", timeout=30, params={"seconds": 1.5, "marker": str(started)}
        )
        results.append(response.status_code)

    worker = threading.Thread(target=slow_request)
    worker.start()
    wait_for(started.exists, 20, "the request to start", interval_s=0.02)
    # Delete while the request runs: the replica finishes it before stopping.
    tk.delete(name)
    worker.join(timeout=30)
    assert results == [200]
    with toolkit.client() as client:
        assert client.get("/drain/items/1").status_code == 404
