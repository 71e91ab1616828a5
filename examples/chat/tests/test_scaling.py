"""The model pool's scaling on its own load: the wait estimates, the policy's decisions
over an AutoscalingContext, the echo engine's numbers, and a deployed pool reporting them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

import app_toolkit as tk
import pytest

from chat.app import build_app
from chat.engines.echo import EchoEngine
from chat.scaling import (
    EngineLoad,
    autoscaling_config,
    replica_metrics,
    scale_on_load,
    slot_waits,
)
from chat.schemas import Generation
from chat.settings import Settings

from .conftest import ECHO


def test_queued_replies_take_the_slots_in_the_order_they_free() -> None:
    # 2 slots free in 5 and 3 steps; 3 queued replies of at most 4 tokens each.
    load = EngineLoad.of(2, (5, 3), ((10, 4), (10, 4), (10, 4)))
    waits, arriving = slot_waits(load)
    assert waits == [3, 5, 7]  # the third takes the first one's slot again (3 + 4)
    assert arriving == 9  # then the slots free at 9 and 11
    assert slot_waits(EngineLoad.of(3, (5,), ((1, 4),))) == ([0], 0)  # free slots
    assert slot_waits(EngineLoad.of(0, (5, 5))) == ([], 0)  # no slot limit


def test_a_replica_reports_its_late_replies_by_the_step_time() -> None:
    load = EngineLoad.of(2, (5, 3), ((10, 4), (20, 4), (30, 4)), step_s=0.5)
    metrics = replica_metrics(load, target_wait_s=2.0)
    # Waits of 1.5, 2.5 and 3.5 s: two over the target.
    assert metrics == {
        "running": 2,
        "waiting": 3,
        "slots": 2,
        "free": 0,
        "kv_cache_use": 0.0,
        "tokens_waiting": 60 + 8,  # the queued prompts and the running replies' remaining tokens
        "slot_wait_s": 4.5,
        "late": 2,
    }
    idle = replica_metrics(EngineLoad.of(8, (100,), step_s=0.5), target_wait_s=2.0)
    assert idle["free"] == 7 and idle["late"] == 0 and idle["slot_wait_s"] == 0


def test_an_engine_that_reports_counts_only_has_its_waiting_replies_count_as_late() -> None:
    load = EngineLoad(slots=4, running=4, waiting=2, kv_cache_use=0.75)  # as vLLM's engine reports
    assert replica_metrics(load, target_wait_s=2.0) == {
        "running": 4,
        "waiting": 2,
        "slots": 4,
        "free": 0,
        "kv_cache_use": 0.75,
        "tokens_waiting": 0,
        "slot_wait_s": 0,
        "late": 2,
    }
    with pytest.raises(ValueError, match="counts only"):
        slot_waits(load)


def context(
    replicas: dict[str, dict[str, float]],
    *,
    target: int = 1,
    running: int | None = None,
    averaged: dict[str, dict[str, float]] | None = None,
    requests: float = 0.0,
    bounds: tuple[int, int] = (1, 3),
) -> tk.AutoscalingContext:
    """A context whose replicas' newest samples are ``replicas`` (replica -> metrics)."""
    raw: dict[str, dict[str, list[tk.autoscaling_policy.TimeStampedValue]]] = {}
    for replica, metrics in replicas.items():
        for name, value in metrics.items():
            raw.setdefault(name, {})[replica] = [tk.autoscaling_policy.TimeStampedValue(9.0, value)]
    names = sorted(replicas)
    return tk.AutoscalingContext(
        deployment_id=tk.autoscaling_policy.DeploymentID("chat", "ChatModel"),
        deployment_name="ChatModel",
        app_name="chat",
        current_num_replicas=len(names) if running is None else running,
        target_num_replicas=target,
        running_replicas=names,
        total_num_requests=requests,
        total_queued_requests=None,
        aggregated_metrics=averaged if averaged is not None else {},
        raw_metrics=raw,
        capacity_adjusted_min_replicas=bounds[0],
        capacity_adjusted_max_replicas=bounds[1],
        current_time=10.0,
        config=tk.AutoscalingConfig(target_ongoing_requests=8),
    )


def full(late: float, free: float = 0, slots: float = 8) -> dict[str, float]:
    return {"slots": slots, "late": late, "free": free, "running": slots - free, "waiting": late}


def test_the_policy_adds_a_replica_per_batch_of_late_replies_the_free_slots_cannot_take() -> None:
    assert scale_on_load(context({"a": full(late=9)})) == (3, {})  # 1 + ceil(9 / 8)
    assert scale_on_load(context({"a": full(late=30)})) == (3, {})  # at most max_replicas
    assert scale_on_load(context({"a": full(late=9), "b": full(late=0, free=8)}, target=2)) == (3, {})
    # Replicas still starting count: the target is never asked to fall while replies are late.
    assert scale_on_load(context({"a": full(late=9)}, target=3)) == (3, {})


def test_replies_waiting_in_the_callers_queues_count_as_late() -> None:
    # Admitted only to free slots: 8 run, 12 more wait at the callers (total_num_requests 20);
    # the look-back's averages, as the requests are.
    held = {"running": {"a": 8.0}, "waiting": {"a": 0.0}}
    twelve_wait = context({"a": full(late=0)}, requests=20, averaged=held)
    assert scale_on_load(twelve_wait) == (3, {})  # 1 + ceil(12 / 8)
    four_wait = context({"a": full(late=0)}, requests=12, averaged=held)
    assert scale_on_load(four_wait) == (2, {})  # 1 + ceil(4 / 8)
    half = {"running": {"a": 4.0}, "waiting": {"a": 0.0}}
    free_slots_take_them = context({"a": full(late=0, free=4)}, requests=6, averaged=half)
    assert scale_on_load(free_slots_take_them) == (1, {})


def test_the_policy_holds_while_free_slots_can_take_the_late_replies() -> None:
    # A new replica runs with free slots; the queue of the first is still late.
    late_but_room = context({"a": full(late=6), "b": full(late=0, free=8)}, target=2)
    assert scale_on_load(late_but_room) == (2, {})


def test_the_policy_shrinks_to_the_replicas_its_replies_fill_on_average() -> None:
    quiet = {"a": full(late=0, free=5), "b": full(late=0, free=8), "c": full(late=0, free=8)}
    averaged = {"running": {"a": 6.0, "b": 3.5, "c": 0.0}, "waiting": {"a": 0.0, "b": 0.0, "c": 0.0}}
    assert scale_on_load(context(quiet, target=3, averaged=averaged)) == (2, {})  # ceil(9.5 / 8)
    idle = {"running": {"a": 0.0}, "waiting": {"a": 0.0}}
    assert scale_on_load(context({"a": full(late=0, free=8)}, averaged=idle)) == (1, {})  # min_replicas
    busy = {"running": {"a": 8.0}, "waiting": {"a": 20.0}}  # a queue, but none of it late
    assert scale_on_load(context({"a": full(late=0)}, averaged=busy)) == (1, {})  # never above the target


def test_the_policy_scales_slotless_engines_on_requests_and_waits_for_a_first_report() -> None:
    echo = {"slots": 0.0, "late": 0.0, "free": 0.0, "running": 20.0, "waiting": 0.0}
    assert scale_on_load(context({"a": echo}, requests=20)) == (3, {})  # ceil(20 / 8)
    assert scale_on_load(context({"a": echo}, target=2, requests=3)) == (1, {})
    assert scale_on_load(context({}, target=2)) == (2, {})


def test_settings_choose_the_policy_and_override_the_pace() -> None:
    settings = Settings(backend="echo", model_autoscaling={"upscale_delay_s": 1.5})
    config = autoscaling_config(settings)
    assert config["policy"] == {"policy_function": scale_on_load} and config["upscale_delay_s"] == 1.5
    assert config["downscale_delay_s"] == 600 and config["max_replicas"] == settings.max_model_replicas
    assert "policy" not in autoscaling_config(Settings(backend="echo", scaling="requests"))


def test_the_echo_engine_reports_the_words_its_replies_have_left() -> None:
    engine = EchoEngine(ECHO.model_copy(update={"echo_tokens_per_s": 1000}))
    generation = Generation(messages=(("user", "one two three four five"),), max_tokens=3)

    async def scenario() -> None:
        assert engine.current_load() == EngineLoad.of(0, ())
        reply = engine.stream(generation)
        assert isinstance(reply, AsyncGenerator)  # an async generator function's: it has aclose()
        await anext(reply)
        assert engine.current_load() == EngineLoad.of(0, (2,))  # max_tokens 3, one sent
        await reply.aclose()
        assert engine.current_load() == EngineLoad.of(0, ())

    asyncio.run(scenario())


def test_the_deployed_pool_reports_its_load_to_its_policy() -> None:
    settings = ECHO.model_copy(update={"model_autoscaling": {"metrics_interval_s": 0.1}})
    words = " ".join(["word"] * 400)  # 2 s at 200 words a second: open while it is sampled
    request = {"model": "echo", "stream": True, "messages": [{"role": "user", "content": words}]}
    with tk.testing.TestClient(build_app(settings)) as client:
        with client.stream("POST", "/v1/chat/completions", json=request) as response:
            next(response.iter_lines())
            scaling = _wait_for_running(client.handle.app_name)
        assert scaling.policy == "chat.scaling:scale_on_load"
        latest = {name: max(values.values()) for name, values in scaling.latest_metrics.items()}
        assert latest["slots"] == 0 and 0 < latest["tokens_waiting"] <= 400


def _wait_for_running(app: str) -> Any:
    """The model pool's autoscaling status once a sample shows a reply running (10 s at most)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        scaling = tk.status().applications[app].deployments["ChatModel"].autoscaling
        if scaling is not None and 1.0 in scaling.latest_metrics.get("running", {}).values():
            return scaling
        time.sleep(0.05)
    pytest.fail("no sample of the model pool showed the reply running within 10 s")
