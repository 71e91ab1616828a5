"""Deployments, handles and composition on both backends."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fastapi import HTTPException

import app_toolkit as tk
from tests.apps import basic, serve_compat
from tests.conftest import Toolkit
from tests.deployments import as_deployment


def test_composition_through_handles(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_composed(), route_prefix="/front")
    with toolkit.client() as client:
        assert client.get("/front/add/5").json() == {"result": 105}
        assert client.get("/front/shout/hey").json() == {"result": "HEY!"}
        assert client.get("/front/chain/1").json() == {"result": 202}
        assert client.get("/front/withdraw").json() == {"error": "cannot withdraw 5"}


def test_handles_from_sync_code(toolkit: Toolkit) -> None:
    name = toolkit.name()
    toolkit.run(basic.make_composed(), name=name, route_prefix=None)
    counter = tk.get_deployment_handle("Counter", name)
    assert counter.add.remote(1).result(timeout_s=10) == 101
    assert counter.options(method_name="sync_double").remote(4).result(timeout_s=10) == 8
    with pytest.raises(basic.Overdrawn, match="cannot withdraw 3"):
        counter.withdraw.remote(3).result(timeout_s=10)
    # Both replicas of Counter serve handle traffic.
    tokens = {counter.who.remote().result(timeout_s=10) for _ in range(40)}
    assert len(tokens) == 2


def test_a_timeout_on_result_stops_the_wait_not_the_call(toolkit: Toolkit) -> None:
    handle = toolkit.run(as_deployment(serve_compat.Slow).bind(), route_prefix=None)
    response = handle.remote(1.0)
    with pytest.raises(TimeoutError):  # tk.RequestTimeoutError
        response.result(timeout_s=0.2)
    assert response.result(timeout_s=10) == "done"  # the call went on


def test_handles_from_async_code(toolkit: Toolkit) -> None:
    name = toolkit.name()
    ingress = toolkit.run(basic.shout.bind(), name=name, route_prefix=None)

    async def many() -> list[str]:
        return list(await asyncio.gather(*(ingress.remote(f"w{i}") for i in range(20))))

    assert asyncio.run(many()) == [f"W{i}!" for i in range(20)]
    assert tk.get_app_handle(name).remote("x").result(timeout_s=10) == "X!"


def test_depends_adds_deployment_and_user_config_reaches_reconfigure(toolkit: Toolkit) -> None:
    name = toolkit.name()
    toolkit.run(basic.make_depends_app(), name=name, route_prefix="/dep")
    assert set(tk.status().applications[name].deployments) == {"Ingress", "Configured"}
    with toolkit.client() as client:
        assert client.get("/dep/greet/ann").json() == {"message": "hi ann"}


def test_missing_targets_fail_fast(toolkit: Toolkit) -> None:
    name = toolkit.name()
    toolkit.run(basic.shout.bind(), name=name, route_prefix=None)
    with pytest.raises(tk.ConfigError, match="has no deployment 'Nope'.*it has: shout"):
        tk.get_deployment_handle("Nope", name)
    with pytest.raises(tk.ConfigError, match="Application .* does not exist"):
        tk.get_app_handle("no-such-app")
    handle = tk.get_app_handle(name)
    tk.delete(name)
    # A handle to a deleted deployment fails at once instead of queueing forever.
    with pytest.raises(tk.ReplicaUnavailableError):
        handle.remote("x").result(timeout_s=10)


def test_a_callers_mistake_is_logged_without_a_traceback(
    local_toolkit: Toolkit, caplog: pytest.LogCaptureFixture
) -> None:
    """A handle call that raises an exception with a 4xx ``status_code`` (FastAPI's
    HTTPException) logs one INFO line; any other exception, ERROR with its traceback."""
    caplog.set_level(logging.INFO, logger="app_toolkit.replica")
    name = local_toolkit.name()
    local_toolkit.run(basic.make_composed(), name=name, route_prefix=None)
    counter = tk.get_deployment_handle("Counter", name)
    with pytest.raises(HTTPException) as missing:
        counter.account.remote("42").result(timeout_s=10)
    assert missing.value.status_code == 404
    with pytest.raises(basic.Overdrawn):
        counter.withdraw.remote(3).result(timeout_s=10)
    records = [r for r in caplog.records if r.name == "app_toolkit.replica" and "Counter." in r.getMessage()]
    refused = [r for r in records if "account" in r.getMessage()]
    raised = [r for r in records if "withdraw" in r.getMessage()]
    assert [(r.levelno, r.exc_info) for r in refused] == [(logging.INFO, None)]
    assert "refused it (404): 404: no account 42" in refused[0].getMessage()
    assert [r.levelno for r in raised] == [logging.ERROR] and raised[0].exc_info is not None
