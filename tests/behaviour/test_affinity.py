"""Session affinity by shard key and by session id on both backends: over HTTP (the
X-SERVE-SHARD-KEY and X-Session-Id headers), WebSockets and handle calls, every request
with one key reaches one replica, the keys spread over all the replicas, and a request
with both is routed by its shard key. A broadcast reaches every replica."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable

import pytest
from websockets.sync.client import connect

import app_toolkit as tk
from tests.apps import basic, sharded
from tests.behaviour.test_websockets import ws_url
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for

KEYS = [f"user-{i}" for i in range(40)]


def _until_all_four(answer: Callable[[], str]) -> None:
    """Keys follow the replica table: wait until this caller's table has all 4 replicas
    (requests without a key reach 4 of them), as a key may move while replicas start."""
    seen: set[str] = set()

    def all_four() -> bool:
        seen.add(answer())
        return len(seen) == 4

    wait_for(all_four, 30, "requests to reach all 4 replicas")


def test_http_requests_with_one_key_reach_one_replica(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_app(num_replicas=4), route_prefix="/aff")
    seen: dict[str, set[str]] = defaultdict(set)
    with toolkit.client() as client:
        # Keyed requests (the caller that serves this connection routes them by key; on
        # Ray that is the ingress replica that owns the connection) reach all 4 replicas
        # only once that caller's table has them all.
        keys = iter(KEYS * 100)
        _until_all_four(
            lambda: str(client.get("/aff/state", headers={"x-serve-shard-key": next(keys)}).json()["replica"])
        )
        for _ in range(3):
            for key in KEYS:
                response = client.get("/aff/state", headers={"x-serve-shard-key": key})
                assert response.status_code == 200
                seen[key].add(response.json()["replica"])
        assert all(len(replicas) == 1 for replicas in seen.values()), seen
        # 40 keys over 4 replicas: each gets some (all four missed by chance: p ≈ 4e-5).
        assert len(set().union(*seen.values())) == 4

        # Ray Serve's X-Session-Id header, any case: a session id routes as a shard key of
        # the same value does.
        for header in ("x-session-id", "X-Session-Id"):
            for key in KEYS[:20]:
                response = client.get("/aff/state", headers={header: key})
                assert response.json()["replica"] in seen[key], (header, key)
        # Both: the shard key wins (the session alone maps 7 of these 10 keys to another
        # of the replicas, ranked 0-3).
        for key in KEYS[:10]:
            response = client.get("/aff/state", headers={"x-serve-shard-key": key, "x-session-id": f"x{key}"})
            assert response.json()["replica"] in seen[key], key


def test_websockets_with_one_key_reach_one_replica(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_ws_app(num_replicas=4), route_prefix="/aff-ws")
    seen: dict[str, set[str]] = defaultdict(set)

    def unkeyed() -> str:
        with connect(ws_url(toolkit, "/aff-ws/ws/who")) as ws:
            ws.send("who")
            return str(ws.recv(timeout=30))

    _until_all_four(unkeyed)
    for _ in range(2):
        for key in KEYS[:20]:
            with connect(
                ws_url(toolkit, "/aff-ws/ws/who"), additional_headers={"X-Serve-Shard-Key": key}
            ) as ws:
                ws.send("who")
                seen[key].add(str(ws.recv(timeout=30)))
    assert all(len(replicas) == 1 for replicas in seen.values()), seen
    assert len(set().union(*seen.values())) >= 3


def test_handle_calls_with_one_shard_key_or_session_reach_one_replica_and_a_broadcast_reaches_all(
    toolkit: Toolkit,
) -> None:
    """One deployment of 4 replicas for both: sessions and broadcasts need several."""
    name = toolkit.name()
    handle = toolkit.run(as_deployment(sharded.Who).bind(), name=name)
    seen: dict[str, set[str]] = defaultdict(set)
    _until_all_four(lambda: handle.remote().result(timeout_s=30))
    for _ in range(3):
        for key in KEYS:
            seen[key].add(handle.options(shard_key=key).remote().result(timeout_s=30))
    assert all(len(replicas) == 1 for replicas in seen.values()), seen
    assert len(set().union(*seen.values())) == 4
    # Without a key, calls spread as before.
    assert len({handle.remote().result(timeout_s=30) for _ in range(40)}) >= 2

    # Ray Serve's handle.options(session_id=...): a session id routes as a shard key of the
    # same value does; with both, the shard key wins (as over HTTP, the same keys).
    for key in KEYS[:20]:
        assert handle.options(session_id=key).remote().result(timeout_s=30) in seen[key], key
    for key in KEYS[:10]:
        both = handle.options(shard_key=key, session_id=f"x{key}")
        assert both.remote().result(timeout_s=30) in seen[key], key

    # handle.broadcast(): one answer per replica, from each of them.
    replicas = {r.replica_id for r in tk.status().applications[name].deployments["Who"].replicas}
    assert len(replicas) == 4
    answers = handle.broadcast("named", "hi ").results(timeout_s=30)
    assert sorted(answers) == sorted(f"hi {r}" for r in replicas)
    # One replica fails: the others still answer; its exception takes its place.
    victim = sorted(replicas)[0]
    failing = handle.broadcast("named", "", victim=victim)
    with pytest.raises(ValueError, match="fails on purpose"):
        failing.results(timeout_s=30)
    mixed = failing.results(timeout_s=30, return_exceptions=True)
    assert sorted(a for a in mixed if isinstance(a, str)) == sorted(replicas - {victim})
    assert [type(a) for a in mixed if not isinstance(a, str)] == [ValueError]

    async def in_async_code() -> list[str]:
        return await handle.broadcast("__call__").results_async(timeout_s=30)

    assert sorted(asyncio.run(in_async_code())) == sorted(replicas)
