"""Custom autoscaling policies on the controller, on a fake clock: what a policy sees, how
its answer moves the target, and what a failing policy does (the target stays, status()
says why, the log says it once)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import pytest

import app_toolkit as tk
from app_toolkit._runtime.controller.custom_scaling import CustomScaling
from app_toolkit._runtime.controller.deployment_state import DeploymentState, follow_autoscaling
from app_toolkit._runtime.controller.policy_calls import PolicyCalls
from app_toolkit._runtime.controller.replica_state import Log, Replica
from app_toolkit._runtime.controller.replica_stats import aggregate
from app_toolkit._runtime.controller.status_view import deployment_status
from app_toolkit._runtime.messages import AppSpec, DeploymentID, DeploymentSpec
from app_toolkit._runtime.tables import ReplicaStats
from app_toolkit.autoscaling_policy import TimeStampedValue
from app_toolkit.config import DeploymentConfig
from app_toolkit.status import ReplicaState
from tests.apps import policies
from tests.waiting import wait_for


class Inline(Executor):
    """Runs each call as it is submitted (a pass later, its outcome is there)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - the future carries it, as a thread's would
            future.set_exception(exc)
        return future


#: The "serialized" policies of these tests: a key per function (the local backend's way).
FUNCTIONS: dict[bytes, Callable[..., Any]] = {}


def serialized(function: Callable[..., Any]) -> bytes:
    key = str(id(function)).encode()
    FUNCTIONS[key] = function
    return key


FAST = {"upscale_delay_s": 0, "downscale_delay_s": 0, "look_back_period_s": 10, "max_replicas": 5}


def deployment(
    policy: Callable[..., Any] | None,
    replicas: int = 1,
    name: str = "D",
    policy_kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> DeploymentState:
    autoscaling: dict[str, Any] = {**FAST, **options}
    if policy is not None:
        given = tk.AutoscalingPolicy(policy_function=policy, policy_kwargs=policy_kwargs or {})
        travelling = given.travelling(serialized(policy))
        autoscaling["policy"] = travelling
    config = DeploymentConfig(autoscaling_config=autoscaling)
    spec = DeploymentSpec(DeploymentID("app", name), b"def", b"args", config, False, "v1")
    state = DeploymentState(spec)
    for index in range(replicas):
        replica_id = f"{name}-{index}"
        state.replicas[replica_id] = Replica(replica_id, "v1", ReplicaState.RUNNING)
    follow_autoscaling(state)
    return state


def scaling(executor: Executor | None = None, timeout_s: float = 10.0) -> CustomScaling:
    return CustomScaling(FUNCTIONS.__getitem__, PolicyCalls(timeout_s, executor or Inline()))


def passes(custom: CustomScaling, state: DeploymentState, times: list[float], load: float = 0.0) -> list[Any]:
    actions: list[Any] = []
    for now in times:
        actions += custom.scale_deployment(state, load, now)
    return actions


def test_a_policy_sees_its_deployment_and_metrics_and_moves_the_target() -> None:
    seen: list[tk.AutoscalingContext] = []

    def policy(context: tk.AutoscalingContext) -> tuple[float, dict[str, Any]]:
        seen.append(context)
        return max(context.aggregated_metrics["wanted"].values()), {"calls": len(seen)}

    state, custom = deployment(policy, replicas=2), scaling()
    for replica, value in (("D-0", 1.0), ("D-1", 2.5)):
        custom.stats.record(ReplicaStats(replica, state.spec.id, ((0.5, (("wanted", value),)),)), now=1.0)
    actions = passes(custom, state, [1.0, 1.1], load=3.0)
    assert state.target == 3  # 2.5 rounds up
    context = seen[0]
    assert (context.deployment_name, context.app_name, context.deployment_id.app_name) == ("D", "app", "app")
    assert (context.current_num_replicas, context.target_num_replicas) == (2, 2)
    assert context.running_replicas == ["D-0", "D-1"] and context.total_num_requests == 3.0
    assert context.raw_metrics["wanted"]["D-1"] == [TimeStampedValue(0.5, 2.5)]
    assert (context.capacity_adjusted_min_replicas, context.capacity_adjusted_max_replicas) == (1, 5)
    assert context.current_time == 1.0 and context.policy_state == {}
    assert seen[1].policy_state == {"calls": 1}  # kept between calls
    assert any(isinstance(a, Log) and "2 -> 3 replicas by policy" in a.message for a in actions)
    info = deployment_status(state, 3.0, 1.1)
    assert info.autoscaling is not None and info.autoscaling.policy is not None
    assert info.autoscaling.policy.endswith(
        "test_a_policy_sees_its_deployment_and_metrics_and_moves_the_target.<locals>.policy"
    )
    assert info.autoscaling.last_decision_metrics == {"wanted": {"D-0": 1.0, "D-1": 2.5}}
    assert info.autoscaling.latest_metrics == {"wanted": {"D-0": 1.0, "D-1": 2.5}}


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (ValueError("metrics service down"), "raised ValueError: metrics service down"),
        (("three", {}), "returned ('three', {}), not (replicas, policy_state)"),
        ("3", "returned '3', not (replicas, policy_state)"),
        ((math.nan, {}), "returned (nan, {})"),
        ((True, {}), "returned (True, {})"),
    ],
)
def test_a_policy_that_raises_or_answers_nonsense_keeps_the_target(answer: object, error: str) -> None:
    def policy(context: tk.AutoscalingContext) -> object:
        if isinstance(answer, Exception):
            raise answer
        return answer

    state, custom = deployment(policy, initial_replicas=2, replicas=2), scaling()
    actions = passes(custom, state, [0.0, 0.1, 0.2, 0.3])
    assert state.target == 2
    logged = [a.message for a in actions if isinstance(a, Log)]
    assert len(logged) == 1 and error in logged[0]  # once per distinct error
    message = deployment_status(state, 0.0, 0.3).message
    assert error in message and "keeping 2 replica(s)" in message


def test_a_policy_that_recovers_clears_its_message() -> None:
    answers: list[object] = [ValueError("down"), (3, {})]

    def policy(context: tk.AutoscalingContext) -> object:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    state, custom = deployment(policy), scaling()
    actions = passes(custom, state, [0.0, 0.1, 0.2])
    assert state.target == 3 and deployment_status(state, 0.0, 0.2).message == ""
    assert [
        a.level for a in actions if isinstance(a, Log) and "policy" in a.message and "->" not in a.message
    ] == [
        30,
        20,
    ]


def test_a_negative_answer_is_clamped_to_min_replicas() -> None:
    state, custom = (
        deployment(lambda context: (-5, {}), replicas=4, initial_replicas=4, min_replicas=2),
        scaling(),
    )
    passes(custom, state, [0.0, 0.1])
    assert state.target == 2


def test_a_hung_policy_is_reported_once_past_its_bound_and_not_called_meanwhile() -> None:
    release, calls = threading.Event(), []

    def policy(context: tk.AutoscalingContext) -> tuple[int, dict[str, Any]]:
        calls.append(context.current_time)
        release.wait(10)
        return 4, {}

    executor = ThreadPoolExecutor(1)
    state, custom = deployment(policy, replicas=2, initial_replicas=2), scaling(executor, timeout_s=1.0)
    try:
        assert passes(custom, state, [0.0, 0.5, 1.0]) == [] and calls == [0.0]
        actions = passes(custom, state, [1.5, 2.0, 5.0])
        logged = [a.message for a in actions if isinstance(a, Log)]
        assert len(logged) == 1 and "did not answer within 1 s" in logged[0]
        assert state.target == 2 and "did not answer within 1 s" in deployment_status(state, 0, 5.0).message
        assert calls == [0.0]  # one call at a time: the hung one is not called again
    finally:
        release.set()
        custom.close()
        executor.shutdown(wait=True)


def test_no_replica_running_starts_one_on_demand_without_asking_the_policy() -> None:
    asked: list[float] = []

    def policy(context: tk.AutoscalingContext) -> tuple[int, dict[str, Any]]:
        asked.append(context.current_time or 0.0)
        return 5, {}

    state, custom = deployment(policy, replicas=0, min_replicas=0), scaling()
    passes(custom, state, [0.0, 0.1])
    assert state.target == 0 and asked == []
    passes(custom, state, [0.2], load=2.0)
    assert state.target == 1 and asked == []


def test_an_application_policy_decides_for_its_deployments_together() -> None:
    front, back = deployment(None, name="Front"), deployment(None, name="Back")
    custom = scaling()
    policy = tk.AutoscalingPolicy(policy_function=policies.together)
    app = AppSpec(
        "app",
        "/",
        "Front",
        (front.spec, back.spec),
        autoscaling_policy=policy.travelling(serialized(policies.together)),
    )
    states = {front.spec.id: front, back.spec.id: back}
    custom.stats.record(ReplicaStats("Front-0", front.spec.id, ((0.0, (("wanted", 3.0),)),)), now=1.0)
    for now in (1.0, 1.1):
        custom.scale_app(app, states, {}, now)
    assert (front.target, back.target) == (3, 3)
    assert deployment_status(back, 0, 1.1).autoscaling.policy == "tests.apps.policies:together"  # type: ignore[union-attr]


def test_an_application_policy_deciding_for_a_stranger_keeps_the_targets() -> None:
    front = deployment(None, name="Front")
    custom = scaling()

    def stranger(contexts: dict[DeploymentID, tk.AutoscalingContext]) -> object:
        return {DeploymentID("app", "Nobody"): 3}, {}

    policy = tk.AutoscalingPolicy(policy_function=stranger).travelling(serialized(stranger))
    app = AppSpec("app", "/", "Front", (front.spec,), autoscaling_policy=policy)
    for now in (1.0, 1.1):
        custom.scale_app(app, {front.spec.id: front}, {}, now)
    assert front.target == 1 and front.autoscaler is not None
    assert "decided for DeploymentID(app='app', name='Nobody')" in front.autoscaler.problem


def test_custom_metrics_aggregate_by_the_configured_function() -> None:
    points = [TimeStampedValue(0.0, 4.0), TimeStampedValue(1.0, 1.0), TimeStampedValue(3.0, 2.0)]
    assert aggregate(points, "max", 4.0) == 4.0
    assert aggregate(points, "min", 4.0) == 1.0
    assert aggregate(points, "mean", 4.0) == (4 * 1 + 1 * 2 + 2 * 1) / 4  # each value for as long as it held
    assert aggregate([TimeStampedValue(2.0, 7.0)], "mean", 2.0) == 7.0
    # From a window's start within the first value's time: 4 held 0.5 of its 3.5 s.
    assert aggregate(points, "mean", 4.0, since=0.5) == pytest.approx((4 * 0.5 + 1 * 2 + 2 * 1) / 3.5)


def test_a_replica_whose_report_is_late_is_seen_at_the_value_it_last_had() -> None:
    """A sample holds until the next: with a look-back shorter than the reports' pace, a
    replica whose samples are all older than the window is still counted (it was not, and
    a policy on the max scaled down while the replica still said 3)."""
    state, custom = deployment(None, replicas=2, look_back_period_s=0.5), scaling()
    key = state.spec.id
    custom.stats.record(ReplicaStats("D-0", key, ((0.0, (("wanted", 3.0),)),)), now=1.0)
    custom.stats.record(ReplicaStats("D-1", key, ((0.0, (("wanted", 1.0),)),)), now=1.9)
    context, latest = custom.context(state, now=2.0)
    assert context.aggregated_metrics["wanted"] == {"D-0": 3.0, "D-1": 1.0}
    assert latest["wanted"] == {"D-0": 3.0, "D-1": 1.0}
    custom.stats.record(ReplicaStats("D-0", key, ((0.0, (("wanted", 2.0),)),)), now=2.1)
    context, _ = custom.context(state, now=2.2)
    # 3 held from the window's start (1.7) to 2.1, then 2: the old sample before it is gone
    # only once a newer one also lies before the window.
    assert context.aggregated_metrics["wanted"]["D-0"] == pytest.approx((3 * 0.4 + 2 * 0.1) / 0.5)


def test_any_real_number_is_an_answer() -> None:
    """Not only int and float: NumPy's numbers are real numbers too (a Fraction here)."""
    state, custom = deployment(lambda context: (Fraction(5, 2), None)), scaling()
    passes(custom, state, [0.0, 0.1])
    assert state.target == 3


class Stepping:
    """A class policy (Ray Serve's): made with its policy_kwargs, keeps state in self."""

    made = 0

    def __init__(self, step: int) -> None:
        Stepping.made += 1
        self.step = step
        self.calls = 0

    def __call__(self, context: tk.AutoscalingContext) -> tuple[int, dict[str, Any]]:
        self.calls += 1
        return context.current_num_replicas + self.step * self.calls, {}


def test_a_class_policy_is_made_once_per_deployment_with_its_kwargs_and_called() -> None:
    Stepping.made = 0
    custom = scaling()
    first = deployment(Stepping, replicas=1, name="A", policy_kwargs={"step": 1})
    second = deployment(Stepping, replicas=1, name="B", policy_kwargs={"step": 2})
    passes(custom, first, [1.0, 1.1])
    passes(custom, second, [1.0, 1.1])
    assert (first.target, second.target) == (2, 3)  # 1 + 1 * 1 and 1 + 2 * 1
    passes(custom, first, [1.2])
    assert first.target == 3  # its instance counts its calls: 1 + 1 * 2
    assert Stepping.made == 2  # one per deployment, not one per call
    changed = deployment(Stepping, replicas=1, name="A", policy_kwargs={"step": 3})
    passes(custom, changed, [1.3, 1.4])
    assert Stepping.made == 3 and changed.target == 4  # new kwargs: a new instance
    upgraded = deployment(Stepping, replicas=1, name="A", policy_kwargs={"step": 3})
    upgraded.spec = dataclasses.replace(upgraded.spec, code_version="v2")
    passes(custom, upgraded, [1.5, 1.6])
    assert Stepping.made == 4 and upgraded.target == 4  # a new version: a new instance


class BuildsInTheBackground:
    """Ray Serve's documented shape: a task on the running loop, started by the policy,
    builds what it decides by (here: 2 replicas until :meth:`make_ready`, then 4)."""

    made: list[BuildsInTheBackground] = []

    def __init__(self) -> None:
        self.wanted = 2
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self.task = self._loop.create_task(self._build())
        self.made.append(self)

    async def _build(self) -> None:
        await self._ready.wait()
        self.wanted = 4

    def make_ready(self) -> None:
        """From the test's thread: the background state is ready."""
        self._loop.call_soon_threadsafe(self._ready.set)

    def __call__(self, context: tk.AutoscalingContext) -> tuple[float, dict[str, Any]]:
        return self.wanted, {}


def test_a_class_policy_that_builds_its_state_in_the_background_scales_once_it_is_ready() -> None:
    """Each policy's calls run on a loop of its own, which runs its tasks between calls."""
    BuildsInTheBackground.made.clear()
    custom = CustomScaling(FUNCTIONS.__getitem__, PolicyCalls(timeout_s=10.0))
    state = deployment(BuildsInTheBackground, replicas=1)
    clock = iter(range(1, 10_000))

    def target_after_a_pass() -> int:
        passes(custom, state, [float(next(clock))])
        return state.target

    try:
        wait_for(lambda: target_after_a_pass() == 2, 10, "the policy's first answer")
        BuildsInTheBackground.made[0].make_ready()
        wait_for(lambda: target_after_a_pass() == 4, 10, "its answer once its background state is ready")
    finally:
        custom.close()


class StartsATask:
    """A class policy that starts a task on its loop (as Ray Serve's documented ones do)."""

    tasks: list[asyncio.Task[bool]] = []

    def __init__(self, step: int = 1) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(asyncio.Event().wait()))

    def __call__(self, context: tk.AutoscalingContext) -> tuple[float, dict[str, Any]]:
        return 1, {}


def test_the_tasks_a_policy_started_end_when_it_is_deleted_replaced_or_overridden() -> None:
    StartsATask.tasks.clear()
    custom = CustomScaling(FUNCTIONS.__getitem__, PolicyCalls(timeout_s=10.0))
    clock = iter(range(1, 10_000))

    def started(state: DeploymentState) -> asyncio.Task[bool]:
        """Pass until ``state``'s policy was made: the task it started."""
        count = len(StartsATask.tasks)

        def made() -> bool:
            passes(custom, state, [float(next(clock))])
            return len(StartsATask.tasks) > count

        wait_for(made, 10, "the policy to be made")
        return StartsATask.tasks[-1]

    try:
        deleted = deployment(StartsATask, name="Deleted")
        task = started(deleted)
        custom.forget(deleted.spec.id)
        wait_for(task.cancelled, 5, "the deleted deployment's task to end")

        task = started(deployment(StartsATask, name="Replaced", policy_kwargs={"step": 1}))
        started(deployment(StartsATask, name="Replaced", policy_kwargs={"step": 2}))
        wait_for(task.cancelled, 5, "the replaced policy's task to end")

        overridden = deployment(StartsATask, name="Overridden")
        task = started(overridden)
        policy = tk.AutoscalingPolicy(policy_function=policies.together).travelling(
            serialized(policies.together)
        )
        app = AppSpec("app", "/", "Overridden", (overridden.spec,), autoscaling_policy=policy)
        custom.scale_app(app, {overridden.spec.id: overridden}, {}, float(next(clock)))
        wait_for(task.cancelled, 5, "the overridden policy's task to end")
        wait_for(task.get_loop().is_closed, 5, "its loop to close")
    finally:
        custom.close()


def test_a_class_policy_serialized_again_keeps_its_instance_and_loads_once() -> None:
    """A config file applied again from another process: cloudpickle writes the class to
    other bytes, but the policy (name, policy_kwargs) and the version are the same, so its
    instance and its state stay (it was made anew), and the class is not loaded again."""
    Stepping.made = 0
    loads: list[bytes] = []

    def load(data: bytes) -> object:
        loads.append(data)
        return Stepping

    custom = CustomScaling(load, PolicyCalls(10.0, Inline()))
    policy = tk.AutoscalingPolicy(policy_function=Stepping, policy_kwargs={"step": 1})
    state = deployment(None, replicas=1, name="A")
    for build, times in ((b"build in one process", [1.0, 1.1]), (b"build in another", [1.2, 1.3])):
        autoscaling = state.spec.config.autoscaling_config
        assert autoscaling is not None
        travelling = autoscaling.model_copy(update={"policy": policy.travelling(build)})
        config = state.spec.config.model_copy(update={"autoscaling_config": travelling})
        state.spec = dataclasses.replace(state.spec, config=config)
        passes(custom, state, times)
    assert Stepping.made == 1 and loads == [b"build in one process"]
    assert state.target == 1 + 1 * 3  # the same instance's third call (a new one's first: 2)
    custom.forget(state.spec.id)  # no custom policy decides for it any more: nothing kept
    passes(custom, state, [1.4])
    assert Stepping.made == 2 and len(loads) == 2


def test_policy_kwargs_must_be_json_values() -> None:
    with pytest.raises(ValueError, match="(?s)policy_kwargs.*JSON values"):
        tk.AutoscalingPolicy(policy_function=Stepping, policy_kwargs={"step": object()})


def test_a_policy_is_equal_by_what_the_user_set_not_by_its_serialized_bytes() -> None:
    policy = tk.AutoscalingPolicy(policy_function=Stepping, policy_kwargs={"step": 1})
    assert policy.travelling(b"one build") == policy.travelling(b"another build")
    assert hash(policy.travelling(b"one")) == hash(policy.travelling(b"two"))
    assert policy != tk.AutoscalingPolicy(policy_function=Stepping, policy_kwargs={"step": 2})
    assert policy != tk.AutoscalingPolicy(policy_function="tests.apps.policies:together")
