"""Request routers: the config that names them (Ray's names, refusals, kwargs), the
chooser that asks them (ranks, full replicas, failures, hooks), and the prefix-aware
router's rule (Ray 2.60's), its reading of requests and its bound."""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import pytest
from pydantic import ValidationError

from app_toolkit._runtime.messages import DeploymentID, HTTPRequest, MethodCall, ReplicaInfo
from app_toolkit._runtime.routing.choice import ReplicaChooser, pending_request
from app_toolkit._runtime.tables import RouterChoice
from app_toolkit.config import DeploymentConfig
from app_toolkit.config.request_router import POWER_OF_TWO, PREFIX_AWARE, RequestRouterConfig
from app_toolkit.request_router import PendingRequest, RequestRouter, RunningReplica
from app_toolkit.request_router.prefix_aware import (
    PrefixCacheAffinityRouter,
    engine_load,
    kv_cache_use,
    request_text,
)
from tests.apps.routers import LowestIdRouter

DEP = DeploymentID("app", "model")
SYSTEM = "You answer questions about the attached contract. " * 4


def info(replica_id: str, capacity: int = 4) -> ReplicaInfo:
    return ReplicaInfo(replica_id, DEP, "127.0.0.1", 1, b"t", capacity)


def running(replica_id: str, capacity: int = 4, **stats: Any) -> RunningReplica:
    return RunningReplica(replica_id, "", capacity, routing_stats=stats)


def asking(text: str, request_id: str = "r") -> PendingRequest:
    return PendingRequest(request_id, ({"messages": [{"role": "user", "content": text}]},))


# ---------------------------------------------------------------------- the config


@pytest.mark.parametrize(
    ("given", "path"),
    [
        ("ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter", POWER_OF_TWO),
        ("ray.serve.llm.request_router:PrefixCacheAffinityRouter", PREFIX_AWARE),
        # Ray's import paths may be dotted (its RequestRouterConfig docstring's example).
        ("ray.serve.llm.request_router.PrefixCacheAffinityRouter", PREFIX_AWARE),
        (
            "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:PrefixCacheAffinityRouter",
            PREFIX_AWARE,
        ),
        (
            "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router.PrefixCacheAffinityRouter",
            PREFIX_AWARE,
        ),
        ("ray.serve._private.request_router.PowerOfTwoChoicesRequestRouter", POWER_OF_TWO),
        ("app_toolkit.request_router.PowerOfTwoChoicesRequestRouter", POWER_OF_TWO),
        (PrefixCacheAffinityRouter, PREFIX_AWARE),
        ("tests.apps.routers:LowestIdRouter", "tests.apps.routers:LowestIdRouter"),
        ("tests.apps.routers.LowestIdRouter", "tests.apps.routers:LowestIdRouter"),
        (LowestIdRouter, "tests.apps.routers:LowestIdRouter"),
    ],
)
def test_a_router_is_named_by_class_or_path_and_ray_names_select_ours(given: Any, path: str) -> None:
    config = RequestRouterConfig(request_router_class=given)
    assert config.class_path == path
    assert config.is_default == (path == POWER_OF_TWO)
    # Ray's defaults of its other fields are taken (serve build writes them).
    written = {"request_router_class": path, "initial_backoff_s": 0.025, "request_routing_stats_period_s": 10}
    assert DeploymentConfig(request_router_config=written).request_router_config == config


def test_the_routing_stats_period_and_timeout_are_taken() -> None:
    config = RequestRouterConfig(request_routing_stats_period_s=0.5, request_routing_stats_timeout_s=2)
    assert (config.request_routing_stats_period_s, config.request_routing_stats_timeout_s) == (0.5, 2.0)
    assert config.is_default  # still the callers' own power of two choices (which reads none)
    assert (
        RequestRouterConfig().request_routing_stats_period_s,
        RequestRouterConfig().request_routing_stats_timeout_s,
    ) == (10, 30)  # Ray's defaults


def _local_class() -> type[RequestRouter]:
    class Local(RequestRouter):
        pass

    return Local


@pytest.mark.parametrize(
    ("given", "fix"),
    [
        ({"request_router_class": "ray.serve.llm.request_router:KVAwareRouter"}, "does not implement"),
        ({"request_router_class": "ray.serve.llm.request_router.KVAwareRouter"}, "does not implement"),
        (
            {"request_router_class": "LowestIdRouter"},
            'must look like "module:attribute" or "module.attribute"',
        ),
        ({"request_router_class": "tests.apps.routers:AsyncRouter"}, "is async; make it a plain def"),
        ({"request_router_class": "tests.apps.routers:Missing"}, "has no attribute"),
        (
            {"request_router_class": "json:dumps"},
            "not a subclass of app_toolkit.request_router.RequestRouter",
        ),
        ({"request_router_class": _local_class()}, "define the class at the top level of a module"),
        (
            {"request_router_class": PREFIX_AWARE, "request_router_kwargs": {"match_rate_threshold": 2}},
            "[0, 1]",
        ),
        ({"request_router_kwargs": {"unknown": 1}}, "takes no request_router_kwargs"),
        ({"max_backoff_s": 2.0}, "max_backoff_s=2.0 is not implemented"),
        # Ray's bounds: positive numbers of seconds.
        ({"request_routing_stats_period_s": 0}, "greater than 0"),
        ({"request_routing_stats_timeout_s": -1.0}, "greater than 0"),
        ({"request_routing_stats_period_s": float("inf")}, "finite number"),
        ({"request_routing_stats_timeout_s": "soon"}, "valid number"),
    ],
)
def test_a_router_that_cannot_route_here_is_refused_naming_the_fix(given: dict[str, Any], fix: str) -> None:
    with pytest.raises(ValidationError, match="request_router_config") as raised:
        DeploymentConfig(request_router_config=given)
    assert fix in str(raised.value)


def test_a_class_on_rays_private_router_api_is_refused_by_name() -> None:
    base = type("RequestRouter", (), {"__module__": "ray.serve._private.request_router.request_router"})
    theirs = type("Mine", (base,), {"__module__": "tests.apps.routers"})
    with pytest.raises(ValidationError, match="subclasses Ray Serve's ray.serve._private"):
        RequestRouterConfig(request_router_class=theirs)


# ---------------------------------------------------------------------- the chooser


def routed_chooser(path: str, **kwargs: Any) -> ReplicaChooser:
    chooser = ReplicaChooser(random.Random(0))
    chooser.set_replicas([info("a", 2), info("b", 2), info("c", 2)])
    chooser.set_router(RouterChoice(path, json.dumps(kwargs)))
    return chooser


def test_the_first_rank_with_a_free_replica_gets_the_request_and_the_router_hears_of_it() -> None:
    chooser = routed_chooser("tests.apps.routers:LowestIdRouter", prefer="b")
    router = chooser.router
    assert isinstance(router, LowestIdRouter) and router.replica_ids == ["a", "b", "c"]
    picks = []
    for number in range(5):
        pending = PendingRequest(f"r{number}")
        chosen = chooser.choose(0.0, pending=pending)
        assert chosen is not None
        chooser.acquire(chosen.replica_id)
        chooser.routed(pending, chosen.replica_id)  # the replica accepted it
        picks.append(chosen.replica_id)
    assert picks == ["b", "b", "a", "a", "c"]  # b is full after two: then the next ranks
    assert router.routed == [(f"r{n}", pick) for n, pick in enumerate(picks)]
    assert chooser.choose(0.0).replica_id == "c"  # type: ignore[union-attr]  # its last slot
    chooser.acquire("c")
    assert chooser.choose(0.0) is None  # every replica is full: the request waits
    chooser.remove("a")
    chooser.set_replicas([info("b", 2), info("c", 2), info("d", 2)])
    assert router.replica_ids == ["b", "c", "d"]
    # A shard key or a multiplexed model goes by its own rule, not the router.
    assert chooser.choose(0.0, model_id="m").replica_id == "d"  # type: ignore[union-attr]


def test_a_failing_router_is_logged_and_power_of_two_routes(caplog: pytest.LogCaptureFixture) -> None:
    chooser = routed_chooser("tests.apps.routers:BrokenRouter")
    with caplog.at_level(logging.ERROR, "app_toolkit.router"):
        assert chooser.choose(0.0, pending=PendingRequest("r")) is not None
        assert chooser.choose(1.0, pending=PendingRequest("r")) is not None
    assert [r.getMessage().count("failed; routing by power of two") for r in caplog.records] == [1]
    # Ranks of the wrong shape are the router's failure too.
    flat = routed_chooser("tests.apps.routers:FlatRouter")
    with caplog.at_level(logging.ERROR, "app_toolkit.router"):
        assert flat.choose(0.0, pending=PendingRequest("r")) is not None
    # A router this process cannot make: power of two choices, logged.
    with caplog.at_level(logging.ERROR, "app_toolkit.router"):
        chooser.set_router(RouterChoice("tests.apps.routers:Missing"))
    assert chooser.router is None and "cannot be made here" in caplog.records[-1].getMessage()
    chooser.set_router(None)
    assert chooser.choose(0.0) is not None


def test_requests_are_read_as_routers_see_them() -> None:
    call = MethodCall("r1", "generate", ({"prompt": "hello"},), {"x": 1}, model_id="m")
    assert pending_request(call) == PendingRequest("r1", ({"prompt": "hello"},), {"x": 1}, "m")
    body = json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}).encode()
    whole = pending_request(HTTPRequest("r2", {"type": "http"}, body))
    assert request_text(whole) == "hi"
    assert request_text(pending_request(HTTPRequest("r3", {"type": "http"}, body, more_body=True))) is None
    assert request_text(PendingRequest("r4", body=b"{not json", body_complete=True)) is None

    class Generation:  # an object with the field, as Ray's router reads it
        messages = ({"role": "system", "content": "be brief. "}, {"role": "user", "content": "why?"})

    assert request_text(PendingRequest("r5", (Generation(),))) == "be brief. why?"
    assert request_text(PendingRequest("r6", ({"prompt": [3, 4, 5]},))) == "3,4,5"
    assert request_text(PendingRequest("r7", (42, "text"))) is None


# ---------------------------------------------------------------------- prefix-aware


def prefix_router(**kwargs: Any) -> tuple[PrefixCacheAffinityRouter, dict[str, int]]:
    router = PrefixCacheAffinityRouter()
    router.initialize_state(**kwargs)
    loads = {"a": 0, "b": 0, "c": 0}
    router.bind_queue_lens(lambda replica_id: loads[replica_id])
    router.update_replicas([running(name) for name in loads])
    return router, loads


def best(router: PrefixCacheAffinityRouter, text: str) -> list[str]:
    ranks = router.choose_replicas([running(name) for name in "abc"], asking(text))
    return sorted(replica.replica_id for replica in ranks[0])


def test_a_prompt_goes_where_its_longest_prefix_went_and_a_new_one_where_the_least_is_held() -> None:
    router, _ = prefix_router()
    router.on_request_routed(asking(SYSTEM + "Clause 1?"), "a")
    router.on_request_routed(asking("Translate this: bonjour"), "b")
    assert best(router, SYSTEM + "Clause 2?") == ["a"]  # the shared prefix is 95 % of it
    # The next turn of the conversation: held by the longer text now, still on a.
    router.on_request_routed(asking(SYSTEM + "Clause 1? It says ..."), "a")
    assert best(router, SYSTEM + "Clause 1? It says ... and then?") == ["a"]
    # Below match_rate_threshold (10 %): the replicas holding the fewest characters (c: none).
    assert best(router, "Something else entirely, and long enough to matter") == ["c"]
    # Every rank after the first is power of two's: a full best replica gives way.
    ranks = router.choose_replicas([running(name) for name in "abc"], asking(SYSTEM))
    assert len(ranks) == 2 and len(ranks[1]) == 2


def test_imbalanced_loads_and_requests_without_text_go_by_power_of_two() -> None:
    router, loads = prefix_router(imbalanced_threshold=2)
    router.on_request_routed(asking(SYSTEM), "a")
    loads.update(a=3, b=0, c=1)  # 3 - 0 > 2: imbalanced
    ranks = router.choose_replicas([running(name) for name in "abc"], asking(SYSTEM + "?"))
    assert len(ranks) == 2 and [len(rank) for rank in ranks] == [1, 1]  # only power of two's pair
    assert loads[ranks[0][0].replica_id] < loads[ranks[1][0].replica_id]  # the less loaded first
    loads.update(a=2)
    assert best(router, SYSTEM + "?") == ["a"]
    no_text = router.choose_replicas([running(name) for name in "abc"], PendingRequest("r"))
    assert sum(map(len, no_text)) == 2  # power of two's pair only


def test_each_replicas_record_is_cut_back_least_recently_used_first() -> None:
    router, _ = prefix_router(eviction_threshold_chars=100, eviction_target_chars=60)
    for number in range(4):
        router.on_request_routed(asking(f"{number}" * 30), "a")  # 120 characters: over 100
    assert best(router, "0" * 30) == ["b", "c"]  # the oldest two went (down to 60)
    assert best(router, "3" * 30) == ["a"]
    router.on_replica_actor_died("a")
    assert best(router, "3" * 30) == ["a", "b", "c"]  # nothing held anywhere: all hold the least


# ------------------------------------------------ prefix-aware, on the replicas' stats


def ranked(router: PrefixCacheAffinityRouter, replicas: list[RunningReplica], text: str) -> list[list[str]]:
    return [
        [replica.replica_id for replica in rank] for rank in router.choose_replicas(replicas, asking(text))
    ]


def test_the_engines_reported_requests_count_in_the_balance_and_the_ties() -> None:
    router, loads = prefix_router(imbalanced_threshold=4)
    # Other callers' requests, as the engines reported them: a runs 5 and queues 1.
    replicas = [running("a", running=5.0, waiting=1.0), running("b"), running("c", running=2.0)]
    ranks = ranked(router, replicas, "A new conversation, nothing held anywhere")
    assert sum(map(len, ranks)) == 2  # 6 - 0 > 4: imbalanced, power of two's pair only
    assert ranks[0] != ["a"]  # and never a first, though this caller sent it nothing
    # Balanced: every replica holds as little (a new conversation), the least loaded first.
    replicas[0] = running("a", running=3.0)
    assert ranked(router, replicas, "A new conversation, nothing held anywhere")[:3] == [["b"], ["c"], ["a"]]
    # This caller's own count is current where the report is old: the larger one counts
    # (their sum would count this caller's requests twice).
    loads.update(b=2, c=1)
    assert ranked(router, replicas, "A new conversation, nothing held anywhere")[:2] == [["b", "c"], ["a"]]
    # Without stats, the rule is Ray's: this caller's counts alone.
    assert ranked(router, [running(name) for name in "abc"], "Another new one")[:2] == [["a"], ["c"]]


def test_a_replica_whose_kv_cache_is_near_full_is_passed_over_for_its_prefix() -> None:
    router, _ = prefix_router()
    router.on_request_routed(asking(SYSTEM + "Clause 1?"), "a")
    router.on_request_routed(asking(SYSTEM + "Clause 9?"), "b")
    full = [running("a", kv_cache_use=0.97), running("b", kv_cache_use=0.5), running("c")]
    assert ranked(router, full, SYSTEM + "Clause 1? And 2?")[0] == ["b"]  # the same prefix, with room
    room = [running("a", kv_cache_use=0.9), running("b", kv_cache_use=0.5), running("c")]
    assert ranked(router, room, SYSTEM + "Clause 1? And 2?")[0] == ["a"]
    # Every replica that holds the prefix is full: a new one goes where the least is held.
    both = [running("a", kv_cache_use=0.97), running("b", kv_cache_use=0.99), running("c")]
    assert ranked(router, both, SYSTEM + "Clause 1? And 2?")[0] == ["c"]
    # Every replica is full: none is passed over.
    every = [running(name, kv_cache_use=1.0) for name in "abc"]
    assert ranked(router, every, SYSTEM + "Clause 1? And 2?")[0] == ["a"]
    tolerant, _ = prefix_router(kv_cache_full_threshold=0.99)
    tolerant.on_request_routed(asking(SYSTEM + "Clause 1?"), "a")
    assert ranked(tolerant, full, SYSTEM + "Clause 1? And 2?")[0] == ["a"]
    with pytest.raises(ValueError, match="kv_cache_full_threshold must be within"):
        prefix_router(kv_cache_full_threshold=0)


@pytest.mark.parametrize(
    "stats",
    [
        {"running": "many", "waiting": True, "kv_cache_use": "full"},
        {"running": -3, "waiting": float("nan"), "kv_cache_use": float("inf")},
        {"running": None, "waiting": [1], "kv_cache_use": -1},
        {"answered": 3},  # a deployment whose stats are others
    ],
)
def test_stats_that_are_not_counts_read_as_none(stats: dict[str, Any]) -> None:
    assert engine_load(running("a", **stats)) == 0
    assert kv_cache_use(running("a", **stats)) == 0.0
    assert kv_cache_use(running("a", kv_cache_use=1.5)) == 1.0  # a share: at most all of it
