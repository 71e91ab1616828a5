"""Request routers on both backends: the prefix-aware router keeps a conversation on one
replica and spreads new ones; a router of the user's own, named in the options, routes,
and reads the replicas' routing stats."""

from __future__ import annotations

import asyncio
import functools

import pytest

import app_toolkit as tk
from app_toolkit.config.request_router import PREFIX_AWARE
from tests.apps import routers
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for

RAY_NAME = "ray.serve.llm.request_router:PrefixCacheAffinityRouter"
DOCUMENT = "Here is the contract you answer questions about, clause by clause. " * 6


def test_the_turns_of_a_conversation_go_to_one_replica_and_new_ones_spread(toolkit: Toolkit) -> None:
    app = as_deployment(routers.Conversations).options(
        request_router_config={
            "request_router_class": "ray.serve.llm.request_router:PrefixCacheAffinityRouter"
        }
    )
    assert app.config.request_router_config.class_path == PREFIX_AWARE  # type: ignore[union-attr]
    handle = toolkit.run(app.bind())

    async def conversation(number: int) -> list[str]:
        messages = [{"role": "system", "content": f"Conversation {number}. {DOCUMENT}"}]
        served = []
        for turn in range(3):
            messages.append({"role": "user", "content": f"Question {turn}?"})
            served.append(await handle.answer.remote({"messages": list(messages)}))
            messages.append({"role": "assistant", "content": f"Answer {turn}."})
        return served

    async def talk() -> list[list[str]]:
        first = await conversation(0)  # one at a time: the second sees where the first went
        return [first, await conversation(1), *await asyncio.gather(conversation(2), conversation(3))]

    conversations = asyncio.run(talk())
    assert all(len(set(turns)) == 1 for turns in conversations), conversations
    assert conversations[0][0] != conversations[1][0]  # a new conversation: the replica holding less
    assert len({turns[0] for turns in conversations}) == 2


def test_a_router_of_the_users_own_routes(toolkit: Toolkit) -> None:
    app = as_deployment(routers.Conversations).options(
        request_router_config={"request_router_class": routers.LowestIdRouter}
    )
    handle = toolkit.run(app.bind())

    async def ask() -> list[str]:
        return [await handle.answer.remote({"prompt": str(number)}) for number in range(8)]

    served = asyncio.run(ask())
    replicas = tk.status().applications[handle.app_name].deployments["Conversations"].replicas
    assert served == [min(replica.replica_id for replica in replicas)] * 8  # power of two would spread


def test_routers_read_the_replicas_routing_stats_as_they_refresh_and_a_failing_hook_is_logged(
    toolkit: Toolkit, caplog: pytest.LogCaptureFixture
) -> None:
    """The replica's record_routing_stats() every 0.2 s reaches the driver's router through
    the tables; a hook that raises, or hangs past its 0.2 s timeout, is logged (on the
    local backend, where its replica logs in this process) while requests keep routing,
    and the stats refresh again once it answers."""
    routers.StatsRouter.latest = {}
    handle = toolkit.run(as_deployment(routers.Reporting).bind(), route_prefix=None)

    def answered() -> int:
        return max((stats.get("answered", 0) for stats in routers.StatsRouter.latest.values()), default=0)

    def logged(problem: str) -> bool:
        return any(problem in record.getMessage() for record in caplog.records)

    replica_id = handle.misbehave.remote("answer").result()
    wait_for(lambda: answered() >= 1, 30, "the first routing stats in the router's table")
    assert set(routers.StatsRouter.latest) == {replica_id}
    seen = answered()
    wait_for(lambda: answered() >= seen + 2, 30, "the stats refreshed twice more")
    for mode, problem in (
        ("raise", "raised RuntimeError: stats broken on purpose"),
        ("hang", "did not return within 0.2 s"),
    ):
        assert handle.misbehave.remote(mode).result() == replica_id  # routing goes on
        if toolkit.backend == "local":
            wait_for(functools.partial(logged, problem), 30, f"the hook's problem logged: {problem}")
    stale = answered()
    assert handle.misbehave.remote("answer").result() == replica_id
    wait_for(lambda: answered() > stale, 30, "the stats refreshed once the hook answers")
    assert routers.StatsRouter.chosen_from[replica_id]["answered"] >= 1  # what the last request's router saw
