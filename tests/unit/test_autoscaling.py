"""The autoscaling policy on a fake clock: delays, bounds, factors, zero, no flapping."""

from __future__ import annotations

import random

from app_toolkit._runtime.controller.autoscaling import Autoscaler, desired_replicas, scaled_step
from app_toolkit.config import AutoscalingConfig


def config(**options: float | int | str | None) -> AutoscalingConfig:
    base: dict[str, float | int | str | None] = {
        "min_replicas": 1,
        "max_replicas": 10,
        "target_ongoing_requests": 2,
        "upscale_delay_s": 3,
        "downscale_delay_s": 10,
        "look_back_period_s": 2,
    }
    return AutoscalingConfig.model_validate({**base, **options})


def run(scaler: Autoscaler, load: float, start: float, until: float, step: float = 0.5) -> list[int]:
    """Feed a steady load every ``step`` seconds; the targets seen along the way."""
    targets, now = [], start
    while now <= until:
        scaler.record(now, load)
        targets.append(scaler.step(now, load))
        now += step
    return targets


def test_upscaling_waits_for_the_delay_then_jumps_to_the_load() -> None:
    scaler = Autoscaler.start(config())
    targets = run(scaler, load=12, start=0, until=2.5)
    assert targets[-1] == 1  # wanted 6 for 2.5 s, the delay is 3 s
    assert run(scaler, load=12, start=3, until=3)[-1] == 6
    decision = scaler.last_decision
    assert decision is not None and (decision.from_replicas, decision.to_replicas) == (1, 6)
    assert decision.load == 12 and decision.at == 3


def test_a_short_spike_changes_nothing() -> None:
    scaler = Autoscaler.start(config())
    run(scaler, load=2, start=0, until=5)
    # Half a second of spike: with the 2 s look-back it wants more for 2.5 s, under the 3 s delay.
    run(scaler, load=40, start=5.5, until=6)
    assert run(scaler, load=2, start=6.5, until=30)[-1] == 1
    assert scaler.last_decision is None


def test_downscaling_waits_longer_and_keeps_room_for_the_load() -> None:
    scaler = Autoscaler.start(config(initial_replicas=6))
    targets = run(scaler, load=5, start=0, until=9.5)
    assert set(targets) == {6}
    assert run(scaler, load=5, start=10, until=12)[-1] == 3  # ceil(5 / 2)


def test_bounds_and_factors() -> None:
    assert desired_replicas(config(), 1000, 2) == 10  # max_replicas
    assert desired_replicas(config(), 0, 5) == 1  # min_replicas
    assert desired_replicas(config(upscaling_factor=0.5), 20, 2) == 6  # half of the 8 missing
    assert desired_replicas(config(downscaling_factor=0.5), 2, 9) == 5  # half of the 8 extra
    assert desired_replicas(config(min_replicas=0), 0.1, 0) == 1


def test_factors_below_one_never_leave_a_drained_deployment_stuck() -> None:
    """Ray Serve's rule: a downscale the factor rounds away still removes one replica,
    so an idle deployment with min_replicas=0 goes from 1 to 0."""
    for factor in ("downscaling_factor", "downscale_smoothing_factor", "smoothing_factor"):
        drained = config(min_replicas=0, **{factor: 0.5})
        assert desired_replicas(drained, 0, 1) == 0, factor
        assert desired_replicas(drained, 0, 2) == 1, factor
        scaler = Autoscaler(drained, 1)
        assert run(scaler, load=0, start=0, until=10)[-1] == 0, factor  # after downscale_delay_s
    assert desired_replicas(config(downscaling_factor=0.5), 5.9, 3) == 3  # within the tolerance: kept
    assert (
        desired_replicas(config(min_replicas=0, downscaling_factor=0.1), 0.5, 1) == 1
    )  # some load: one stays


def test_scale_from_zero_is_immediate_and_back_to_zero_after_its_own_delay() -> None:
    scaler = Autoscaler.start(config(min_replicas=0, downscale_to_zero_delay_s=4))
    assert scaler.target == 0
    scaler.record(0, 0)
    assert scaler.step(0, current_load=1) == 1  # first request: no waiting for averages
    targets = run(scaler, load=0, start=0.5, until=4)
    assert targets[-1] == 1
    assert run(scaler, load=0, start=4.5, until=5)[-1] == 0


def test_a_steady_load_at_the_target_does_not_flap() -> None:
    scaler = Autoscaler.start(config(initial_replicas=4))
    noise = random.Random(7)
    now = 0.0
    for _ in range(2000):  # 1,000 s of load 8 ± 8 %, i.e. 4 replicas at target 2
        scaler.record(now, 8 * (1 + noise.uniform(-0.08, 0.08)))
        assert scaler.step(now) == 4
        now += 0.5
    assert scaler.last_decision is None


def test_the_average_over_the_look_back_window_is_kept_as_samples_come_and_go() -> None:
    scaler = Autoscaler(AutoscalingConfig(min_replicas=0, look_back_period_s=1.0), 1)
    rng = random.Random(7)
    for tick in range(2000):
        now = tick * 0.05
        scaler.record(now, rng.choice([0.0, 0.1, 0.3, 2.0, 7.0]))
        window = [load for at, load in scaler.samples]
        assert 20 <= len(window) <= 21 or tick < 20  # samples within the last second
        assert abs(scaler.average_load() - sum(window) / len(window)) < 1e-9
    # Fractional loads came and went thousands of times; once only zeros are left in the
    # window the average is exactly 0 (a residue would scale up from zero).
    for tick in range(2000, 2030):
        scaler.record(tick * 0.05, 0.0)
    assert scaler.average_load() == 0.0


def test_aggregation_function_max_and_min_over_the_look_back() -> None:
    """mean (the default), max and min of the load samples within look_back_period_s."""
    loads = [(0.0, 4.0), (0.5, 1.0), (1.0, 2.0), (1.5, 3.0)]
    aggregated = {}
    for aggregation in ("mean", "max", "min"):
        scaler = Autoscaler.start(config(aggregation_function=aggregation, look_back_period_s=2))
        for at, load in loads:
            scaler.record(at, load)
        aggregated[aggregation] = scaler.average_load()
        scaler.record(2.6, 2.5)  # the 4 at t=0 and the 1 at t=0.5 leave the window
        aggregated[aggregation + " later"] = scaler.average_load()
    assert aggregated == {
        "mean": 2.5,
        "mean later": 2.5,
        "max": 4.0,
        "max later": 3.0,
        "min": 1.0,
        "min later": 2.0,
    }


def test_a_custom_answer_is_stepped_rounded_up_and_clamped_as_ray_serve_does() -> None:
    """The answer is a raw count: the factor scales the step from the running replicas,
    the result rounds up, then stays within [min_replicas, max_replicas]."""
    assert scaled_step(config(), 2.2, 1) == 3  # a fraction rounds up
    assert scaled_step(config(upscaling_factor=0.5), 9, 1) == 5  # half the step of 8
    assert scaled_step(config(downscaling_factor=0.5), 1, 9) == 5
    assert scaled_step(config(downscaling_factor=0.1), 4, 5) == 4  # never stuck: one less
    assert scaled_step(config(smoothing_factor=0.5), 9, 1) == 5  # Ray Serve's deprecated fallback
    scaler = Autoscaler.start(config(upscale_delay_s=0, downscale_delay_s=0, min_replicas=2))
    assert scaler.follow(0, 1000, running=2) == 10  # max_replicas
    assert scaler.follow(1, -5, running=10) == 2  # min_replicas
    decision = scaler.last_decision
    assert decision is not None and (decision.from_replicas, decision.to_replicas) == (10, 2)


def test_a_custom_answer_waits_for_the_delays_and_keeps_its_metrics() -> None:
    scaler = Autoscaler.start(config())  # upscale after 3 s, downscale after 10 s
    seen = {"queue": {"r1": 7.0}}
    assert [scaler.follow(at, 4, running=1, metrics=seen) for at in (0, 1, 2)] == [1, 1, 1]
    assert scaler.follow(3, 4, running=1, metrics=seen) == 4
    assert scaler.last_decision is not None and scaler.last_decision.metrics == seen
    assert scaler.last_scale_up_at == 3 and scaler.last_scale_down_at is None
    assert scaler.follow(4, 1, running=4) == 4 and scaler.follow(14, 1, running=4) == 1
    assert scaler.last_scale_down_at == 14


def test_a_custom_policy_at_zero_replicas_starts_one_on_demand_without_asking() -> None:
    scaler = Autoscaler.start(config(min_replicas=0))
    assert scaler.cold_start(0, current_load=0) == 0
    assert scaler.cold_start(1, current_load=3) == 1
    # Down to zero only from one replica: from more it stops at one.
    busy = Autoscaler.start(config(min_replicas=0, initial_replicas=3, downscale_delay_s=0))
    assert busy.follow(0, 0, running=3) == 1 and busy.follow(1, 0, running=1) == 0
