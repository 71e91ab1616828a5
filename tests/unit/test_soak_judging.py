"""The chaos soak's pure parts: its seeded kill schedule (every kind at least five times
in half an hour, replayed exactly) and the rules that judge each request."""

from __future__ import annotations

import pytest

from benchmarks.soak_rules import UNEXPLAINED, Kill, Record, classify, judge, stalls
from benchmarks.soak_schedule import KINDS, SPARED, Schedule, make_schedule


def test_a_seed_makes_one_schedule_and_another_seed_another() -> None:
    assert make_schedule(7, 1800) == make_schedule(7, 1800)
    assert make_schedule(7, 1800) != make_schedule(8, 1800)


@pytest.mark.parametrize("seed", range(20))
def test_half_an_hour_kills_every_kind_five_times_10_to_30_s_apart(seed: int) -> None:
    schedule = make_schedule(seed, 1800, 10, 30)
    assert all(schedule.counts()[kind] >= 5 for kind in KINDS), schedule.counts()
    times = [0.0] + [kill.at_s for kill in schedule.kills]
    assert all(10 <= later - earlier <= 30 + 1e-6 for earlier, later in zip(times, times[1:], strict=False))
    assert schedule.kills[-1].at_s <= 1800 - 10
    assert all(0 <= kill.pick < 1 for kill in schedule.kills)


@pytest.mark.parametrize("seed", range(20))
def test_a_spared_tail_kills_no_controller_or_proxy_and_every_kind_still_five_times(seed: int) -> None:
    spared = make_schedule(seed, 1800, 10, 30, spare_last_s=420)
    assert all(spared.counts()[kind] >= 5 for kind in KINDS), spared.counts()
    assert not [kill for kill in spared.kills if kill.kind in SPARED and kill.at_s > 1800 - 420]
    # Before the tail it is the schedule the seed makes without one; the times stay.
    whole = make_schedule(seed, 1800, 10, 30)
    assert [k for k in spared.kills if k.at_s <= 1380] == [k for k in whole.kills if k.at_s <= 1380]
    tail = [k.kind for k in spared.kills if k.at_s > 1380]
    assert len(set(tail)) >= 3  # the other kinds go on being killed
    assert [(k.at_s, k.pick) for k in spared.kills] == [(k.at_s, k.pick) for k in whole.kills]


def test_a_written_schedule_replays_as_it_was() -> None:
    schedule = make_schedule(3, 600, 5, 10)
    assert Schedule.from_json(schedule.to_json()) == schedule
    assert "per kind:" in schedule.describe()


def test_a_replayed_schedule_with_an_unknown_kind_is_refused() -> None:
    text = '{"seed": 1, "duration_s": 60, "kills": [{"at_s": 5, "kind": "datacenter", "pick": 0.5}]}'
    with pytest.raises(ValueError, match="datacenter"):
        Schedule.from_json(text)


def test_bad_gaps_are_refused() -> None:
    with pytest.raises(ValueError, match="kill_min_s"):
        make_schedule(1, 60, 10, 5)
    with pytest.raises(ValueError, match="spare_last_s"):
        make_schedule(1, 60, 10, 30, spare_last_s=60)


HEAD, WORKER = "head-node", "worker-node"


def _kill(
    kind: str, at: float, target: str = "", node: str = WORKER, app: str = "soak", deployment: str = ""
) -> Kill:
    return Kill(kind, at, at + 0.1, target or kind, node, app, deployment)


def _record(
    kind: str = "http", outcome: str = "intact", start: float = 9.0, end: float = 11.0, **fields: object
) -> Record:
    record = Record(kind, start, end, outcome)
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def test_a_502_in_flight_on_a_killed_ingress_replica_is_explained() -> None:
    record = _record(outcome="status", status=502)
    assert classify(record, [_kill("ingress", 10, "r1")]).startswith("502")


def test_a_502_long_after_the_kill_or_for_another_app_is_not() -> None:
    late = _record(outcome="status", status=502, start=20, end=21)
    assert classify(late, [_kill("ingress", 10, "r1")]) == UNEXPLAINED
    other_app = _record(outcome="status", status=502)
    assert classify(other_app, [_kill("model", 10, "m1", app="llm")]) == UNEXPLAINED


def test_a_cut_stream_is_explained_only_by_the_death_of_its_own_replica() -> None:
    cut = _record("sse", "closed", head=True, replica="r1", node=HEAD)
    assert classify(cut, [_kill("ingress", 10, "r1", node=HEAD)]).startswith("closed mid-response")
    assert classify(cut, [_kill("ingress", 10, "r2", node=HEAD)]) == UNEXPLAINED


def test_the_controller_dying_explains_no_failure() -> None:
    for outcome in ("status", "closed", "reset", "error-event", "timeout"):
        record = _record("chat", outcome, status=503, head=True)
        assert classify(record, [_kill("controller", 10, node=HEAD)]) == UNEXPLAINED


def test_a_proxy_kill_explains_its_own_connections_only() -> None:
    mine = _record(outcome="reset", proxy_node=WORKER)
    theirs = _record(outcome="reset", proxy_node=HEAD)
    unknown = _record(outcome="closed")
    kill = _kill("proxy", 10, WORKER, node=WORKER)
    assert classify(mine, [kill]).startswith("connection closed")
    assert classify(unknown, [kill]).startswith("connection closed")
    assert classify(theirs, [kill]) == UNEXPLAINED
    verdict = judge([mine, theirs], [kill])
    assert verdict.resets_while_proxy_lived == [theirs]


def test_a_handle_call_is_never_explained_by_a_proxy() -> None:
    record = _record("handle", "reset")
    assert classify(record, [_kill("proxy", 10, WORKER)]) == UNEXPLAINED


def test_redis_dying_explains_resumable_replies_only() -> None:
    kill = _kill("redis", 10, "redis", node="", app="")
    assert classify(_record("resumable", "store-lost"), [kill]).startswith("resumable reply lost with Redis")
    assert classify(_record("sse", "closed", head=True), [kill]) == UNEXPLAINED


def test_an_abandoned_reply_is_explained_by_its_writers_death() -> None:
    record = _record("resumable", "abandoned", writer="r1", writer_node=HEAD, replica="r2")
    assert classify(record, [_kill("ingress", 10, "r1", node=HEAD)]).startswith("resumable reply abandoned")
    assert classify(record, [_kill("ingress", 10, "r3", node=HEAD)]) == UNEXPLAINED


def test_a_resumed_reply_is_intact_only_if_each_cut_had_a_kill() -> None:
    explained = _record("resumable", cuts=[10.5])
    assert classify(explained, [_kill("proxy", 10, WORKER)]) == "intact"
    unexplained = _record("resumable", cuts=[10.5], start=5, end=30)
    assert classify(unexplained, [_kill("controller", 10, node=HEAD)]) == UNEXPLAINED
    assert classify(unexplained, []) == UNEXPLAINED


def test_corrupt_data_is_never_explained_and_is_counted() -> None:
    record = _record("chat", "corrupt", detail="a word twice")
    verdict = judge([record], [_kill("model", 10, app="llm")])
    assert verdict.corrupt == [record] and verdict.unexplained == [record]
    assert not verdict.passed()


def test_the_intact_share_counts_requests_no_kill_touched() -> None:
    calm = [_record(start=t, end=t + 0.5) for t in range(20, 39)] + [
        _record("http", "status", 40, 41, status=500)
    ]
    touched = _record(outcome="status", status=502)
    verdict = judge([*calm, touched], [_kill("ingress", 10, "r1")])
    assert (verdict.calm, verdict.calm_intact) == (20, 19)
    assert verdict.calm_intact_share == 0.95
    assert verdict.per_rule and verdict.per_kind["http"]["intact"] == 19
    assert not verdict.passed()  # the 500 is unexplained


def test_a_refused_connection_is_explained_until_the_killed_proxy_is_back() -> None:
    kill = Kill("proxy", 10, 10.1, WORKER, WORKER, recovered=12)
    assert classify(_record(outcome="refused", start=11.5, end=11.6), [kill]).startswith("refused")
    assert classify(_record(outcome="refused", start=13, end=13.1), [kill]) == UNEXPLAINED


def test_a_cut_just_after_a_short_kill_is_still_that_kills() -> None:
    record = _record("resumable", start=10.5, end=12, cuts=[10.6])
    assert classify(record, [_kill("redis", 10, node="", app="")]) == "intact"


def test_a_reader_cut_at_each_resume_of_a_reply_whose_writer_died_is_explained() -> None:
    record = _record(
        "resumable", "closed", start=9, end=30, head=True, writer="r1", replica="r2", cuts=[10.2, 14]
    )
    assert classify(record, [_kill("ingress", 10, "r1")]).startswith("resumable reply abandoned")


def test_a_cut_is_judged_by_the_proxy_of_the_connection_it_cut_not_the_last_one() -> None:
    """Resumed on a connection to another node's proxy: the cut was the killed proxy's."""
    kill = _kill("proxy", 10, WORKER, node=WORKER, app="")
    resumed = _record("resumable", start=9, end=12, cuts=[10.05], cut_proxies=[WORKER], proxy_node=HEAD)
    assert classify(resumed, [kill]) == "intact"
    elsewhere = _record("resumable", start=9, end=12, cuts=[10.05], cut_proxies=[HEAD], proxy_node=WORKER)
    assert classify(elsewhere, [kill]) == UNEXPLAINED


@pytest.mark.parametrize("kind", ["chat", "smol", "completion"])
def test_a_model_replicas_kill_explains_no_failure_of_an_llm_reply(kind: str) -> None:
    """An LLM reply goes on on another replica when its own is lost (docs/llm.md): its
    error event, 502 or cut is unexplained; a handle call's 502 still is explained."""
    kill = _kill("model", 10, "m1", app="llm")
    for outcome, status in (("error-event", 0), ("status", 502), ("status", 503), ("closed", 0)):
        record = _record(kind, outcome, status=status, head=True)
        assert classify(record, [kill]) == UNEXPLAINED, (outcome, status)
    handle = _record("handle", "status", status=502)
    assert classify(handle, [_kill("model", 10, "a1", app="soakh")]).startswith("502")


def test_stalls_are_reported_apart_for_replies_a_model_kill_met() -> None:
    met = [_record("smol", start=9, end=11, stall_s=s) for s in (2.0, 4.0, 6.0)]
    calm = [_record("smol", start=50 + n, end=51 + n, stall_s=0.1) for n in range(3)]
    echo = [_record("chat", start=9, end=11, stall_s=0.5)]
    cut = [_record("smol", "closed", start=9, end=11, stall_s=30.0)]  # not intact: not a stall
    smol_kill = _kill("model", 10, "llm.LLMServer-smollm2.m1", app="llm", deployment="LLMServer-smollm2")
    table = stalls([*met, *calm, *echo, *cut], [smol_kill])
    smol = table["transformers (SmolLM2)"]
    assert (smol["met_replies"], smol["met_p50_s"], smol["met_max_s"]) == (3, 4.0, 6.0)
    assert (smol["calm_replies"], smol["calm_p99_s"]) == (3, 0.1)
    # The echo reply met another model's kill: neither lost nor calm.
    assert table["echo"]["met_replies"] == 0 and table["echo"]["calm_replies"] == 0
