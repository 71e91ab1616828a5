"""Custom autoscaling policies: a deployment's own, or its application's for all of its
autoscaled deployments at once (Ray Serve's ``AutoscalingPolicy``).

On each pass of the controller a deployment under a custom policy records its load as
any autoscaled one does; then the outcome of the policy's previous call (if it has one
now) moves the target through ``Autoscaler.follow`` (factors, rounding, bounds, delays),
and a new call starts with a fresh :class:`~app_toolkit.AutoscalingContext` unless the
previous one still runs (``policy_calls.py``). A call that raises, overruns its bound or
answers something that is not a replica count keeps the target where it is: the error
shows in ``status()`` as the deployment's message and is logged once per distinct error.
A deployment with no replica running is not asked: demand starts one (``cold_start``).
A class policy is made once per deployment (or application) with its ``policy_kwargs``,
on its first call, and its instance is called from then on (Ray Serve's rule), while the
policy (what the user set: its name and ``policy_kwargs``) and the deployment's version
stay the same: a config file applied again, from another process, serializes the class
to other bytes but keeps the instance and its state.
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from app_toolkit._runtime.controller.autoscaling import Autoscaler, Metrics
from app_toolkit._runtime.controller.deployment_state import Action, DeploymentState
from app_toolkit._runtime.controller.policy_calls import Answered, Failed, PolicyCalls
from app_toolkit._runtime.controller.replica_state import Log
from app_toolkit._runtime.controller.replica_stats import StatsBook
from app_toolkit._runtime.messages import AppSpec, DeploymentID
from app_toolkit.autoscaling_policy import AutoscalingContext
from app_toolkit.config import AutoscalingPolicy
from app_toolkit.status import ReplicaState

#: Loads a serialized policy function (the backend's ``load_object``).
LoadObject = Callable[[bytes], object]


class CustomScaling:
    """Runs the controller's custom autoscaling policies and keeps their metrics."""

    def __init__(self, load_object: LoadObject, calls: PolicyCalls | None = None) -> None:
        self._load_object = load_object
        self.calls = calls or PolicyCalls()
        #: Replicas' custom metrics (``record_autoscaling_stats()``).
        self.stats = StatsBook()
        #: Each deployment's or application's policy as loaded: (the policy and version it
        #: was loaded for, what to call). One per key: replaced when either changes.
        self._loaded: dict[Hashable, tuple[tuple[AutoscalingPolicy, str], Callable[[Any], object]]] = {}
        # What each running call was given: its deployments' metrics (aggregated, newest),
        # shown with its decision.
        self._given: dict[Hashable, dict[DeploymentID, tuple[Metrics, Metrics]]] = {}
        self._errors: dict[Hashable, str] = {}  # the last error logged per policy
        self._overridden: set[DeploymentID] = set()  # own policies an application's replaces (logged)

    def close(self) -> None:
        self.calls.close()

    # ------------------------------------------------------------------ one deployment

    def scale_deployment(self, state: DeploymentState, load: float, now: float) -> list[Action]:
        """One pass of a deployment under its own custom policy."""
        scaler = state.autoscaler
        config = state.spec.config.autoscaling_config
        if scaler is None or config is None or state.deleting:
            return []
        key = state.spec.id
        before = scaler.target
        scaler.record(now, load)
        scaler.policy = config.policy.name
        running = _running(state)
        actions: list[Action] = []
        outcome = self.calls.take(key, now)
        given = self._given.pop(key, {}) if outcome is not None else {}
        if not running:
            scaler.cold_start(now, load)
        elif isinstance(outcome, Answered):
            answer = _deployment_answer(outcome.value)
            if isinstance(answer, str):
                actions += self._failed(key, [scaler], config.policy.name, answer)
            else:
                wanted, policy_state = answer
                scaler.policy_state = policy_state
                _show(scaler, given.get(key))
                scaler.follow(now, wanted, len(running), scaler.seen)
                actions += self._recovered(key, config.policy.name)
        elif isinstance(outcome, Failed):
            actions += self._failed(key, [scaler], config.policy.name, outcome.error)
        if running and not self.calls.running(key):
            function = self._function(key, config.policy, state.spec.code_version)
            if isinstance(function, str):
                actions += self._failed(key, [scaler], config.policy.name, function)
            else:
                context, latest = self.context(state, now)
                self._given[key] = {key: (context.aggregated_metrics, latest)}
                self.calls.start(key, function, context, now)
        return actions + _moved(state, before)

    # ------------------------------------------------------------------ applications

    def scale_app(
        self,
        app: AppSpec,
        states: Mapping[DeploymentID, DeploymentState],
        loads: Mapping[DeploymentID, float],
        now: float,
    ) -> list[tuple[DeploymentID, list[Action]]]:
        """One pass of an application's policy over its autoscaled deployments."""
        policy = app.autoscaling_policy
        governed = {
            spec.id: states[spec.id]
            for spec in app.deployments
            if spec.id in states and states[spec.id].autoscaler is not None and not states[spec.id].deleting
        }
        if policy is None or not governed:
            return []
        key = ("application", app.name)
        actions: list[Action] = []
        for deployment, state in governed.items():
            self._drop_policy(deployment)  # its own policy, if it ran before: its call, loop and tasks end
            own = state.spec.config.autoscaling_config
            if own is not None and not own.policy.is_default and deployment not in self._overridden:
                self._overridden.add(deployment)  # as Ray Serve: the application's wins, with a warning
                message = f"{deployment}: the application's autoscaling policy {policy.name} replaces its own"
                actions.append(Log(logging.WARNING, message))
        before = {deployment: state.target for deployment, state in governed.items()}
        scalers: dict[DeploymentID, Autoscaler] = {}
        for deployment, state in governed.items():
            scaler = state.autoscaler
            assert scaler is not None
            scaler.record(now, loads.get(deployment, 0.0))
            scaler.policy = policy.name
            scalers[deployment] = scaler
        running = {deployment: _running(state) for deployment, state in governed.items()}
        outcome = self.calls.take(key, now)
        given = self._given.pop(key, {}) if outcome is not None else {}
        if isinstance(outcome, Answered):
            answer = _app_answer(outcome.value, set(governed))
            if isinstance(answer, str):
                actions += self._failed(key, list(scalers.values()), policy.name, answer)
            else:
                decisions, states_after = answer
                for deployment, scaler in scalers.items():  # as Ray Serve: the state returned, or none
                    scaler.policy_state = states_after.get(deployment, {})
                for deployment, wanted in decisions.items():
                    scaler = scalers[deployment]
                    _show(scaler, given.get(deployment))
                    if running[deployment]:
                        scaler.follow(now, wanted, len(running[deployment]), scaler.seen)
                for scaler in scalers.values():
                    scaler.problem = ""
                actions += self._recovered(key, policy.name)
        elif isinstance(outcome, Failed):
            actions += self._failed(key, list(scalers.values()), policy.name, outcome.error)
        for deployment, scaler in scalers.items():
            if not running[deployment]:
                scaler.cold_start(now, loads.get(deployment, 0.0))
        if not self.calls.running(key):
            function = self._function(key, policy, ",".join(spec.code_version for spec in app.deployments))
            if isinstance(function, str):
                actions += self._failed(key, list(scalers.values()), policy.name, function)
            else:
                built = {deployment: self.context(state, now) for deployment, state in governed.items()}
                self._given[key] = {
                    d: (context.aggregated_metrics, latest) for d, (context, latest) in built.items()
                }
                contexts = {deployment: context for deployment, (context, _) in built.items()}
                self.calls.start(key, function, contexts, now)
        first = next(iter(governed))
        moved = [(deployment, _moved(state, before[deployment])) for deployment, state in governed.items()]
        return [(first, actions), *moved]

    # ------------------------------------------------------------------ shared

    def context(self, state: DeploymentState, now: float) -> tuple[AutoscalingContext, Metrics]:
        """What the policy of ``state``'s deployment sees now, and the newest value of
        each custom metric (for status)."""
        scaler = state.autoscaler
        config = state.spec.config.autoscaling_config
        assert scaler is not None and config is not None
        deployment = state.spec.id
        running = _running(state)
        aggregated, raw, latest = self.stats.window(deployment, running, config, now)
        lower, upper = scaler.limits()
        context = AutoscalingContext(
            deployment_id=deployment,
            deployment_name=deployment.name,
            app_name=deployment.app,
            current_num_replicas=len(running),
            target_num_replicas=scaler.target,
            running_replicas=running,
            total_num_requests=scaler.average_load(),
            total_queued_requests=None,
            aggregated_metrics=aggregated,
            raw_metrics=raw,
            capacity_adjusted_min_replicas=lower,
            capacity_adjusted_max_replicas=upper,
            policy_state=dict(scaler.policy_state),
            last_scale_up_time=scaler.last_scale_up_at,
            last_scale_down_time=scaler.last_scale_down_at,
            current_time=now,
            config=config,
        )
        return context, latest

    def forget(self, key: DeploymentID | str) -> None:
        """A deployment that was deleted, or that no custom policy decides for any more
        (its metrics, its policy's call), or an application that was deleted (a str)."""
        if isinstance(key, str):
            self._drop_policy(("application", key))
            return
        if not (self.stats.holds(key) or key in self._loaded or key in self._errors):
            return  # the usual case, on every pass of every deployment on the built-in policy
        self.stats.forget(key)
        self._drop_policy(key)
        self._overridden.discard(key)

    def _drop_policy(self, key: Hashable) -> None:
        """``key``'s policy decides no more: its call is abandoned, its loop (with the tasks
        it started) stopped, its instance and last error dropped; cheap when it has none."""
        if key not in self._loaded and key not in self._errors and not self.calls.running(key):
            return
        self.calls.forget(key)
        self._given.pop(key, None)
        self._errors.pop(key, None)
        self._loaded.pop(key, None)

    def _function(
        self, key: Hashable, policy: AutoscalingPolicy, version: str
    ) -> Callable[[Any], object] | str:
        """What to call for ``key``'s policy: its function, or a class policy's instance,
        loaded once per ``key``, policy and ``version`` (of its deployments); or why it
        cannot be loaded. The policy is compared by what the user set, not by its bytes."""
        identity = (policy, version)
        loaded = self._loaded.get(key)
        if loaded is not None and loaded[0] == identity:
            return loaded[1]
        if loaded is not None:  # a new policy: what the old one started on its loop ends
            self.calls.forget(key)
        try:
            function = self._load_object(policy.serialized)
        except Exception as exc:  # noqa: BLE001 - the policy's code or its imports are the user's
            return f"cannot be loaded on the controller ({type(exc).__name__}: {exc})"
        if not callable(function):
            return f"is a {type(function).__name__}, not a function"
        call = _ClassPolicy(function, policy.policy_kwargs) if inspect.isclass(function) else function
        self._loaded[key] = (identity, call)
        return call

    def _failed(self, key: Hashable, scalers: list[Autoscaler], name: str, error: str) -> list[Action]:
        """Keep the targets; say why in status(), and in the log once per distinct error."""
        for scaler in scalers:
            scaler.problem = f"autoscaling policy {name} {error}; keeping {scaler.target} replica(s)"
        if self._errors.get(key) == error:
            return []
        self._errors[key] = error
        return [Log(logging.WARNING, f"{_named(key)}: autoscaling policy {name} {error}; the target stays")]

    def _recovered(self, key: Hashable, name: str) -> list[Action]:
        if self._errors.pop(key, None) is None:
            return []
        return [Log(logging.INFO, f"{_named(key)}: autoscaling policy {name} answers again")]


class _ClassPolicy:
    """A class policy: made with its ``policy_kwargs`` on its first call (in the policy's
    worker thread, like the calls, so a slow constructor does not hold up the controller;
    one that raises fails that call and is tried again on the next), then called."""

    def __init__(self, cls: Callable[..., object], kwargs: dict[str, Any]) -> None:
        self._cls = cls
        self._kwargs = kwargs
        self._instance: Callable[[Any], object] | None = None

    def __call__(self, context: object) -> object:
        if self._instance is None:
            made = self._cls(**self._kwargs)
            if not callable(made):
                raise TypeError(f"{type(made).__name__} defines no __call__(self, context)")
            self._instance = made
        return self._instance(context)


def _show(scaler: Autoscaler, given: tuple[Metrics, Metrics] | None) -> None:
    """Status shows the metrics a call was given (aggregated and newest), together."""
    if given is not None:
        scaler.seen, scaler.latest = given


def _running(state: DeploymentState) -> list[str]:
    return sorted(
        r.replica_id
        for r in state.replicas.values()
        if r.state is ReplicaState.RUNNING and not r.stop_requested
    )


def _moved(state: DeploymentState, before: int) -> list[Action]:
    scaler = state.autoscaler
    if scaler is None or scaler.target == before:
        return []
    decision = scaler.last_decision
    seen = ""
    if decision is not None and decision.metrics:
        seen = (
            " (it saw " + ", ".join(_summary(name, values) for name, values in decision.metrics.items()) + ")"
        )
    return [
        Log(
            logging.INFO,
            f"{state.spec.id}: {before} -> {scaler.target} replicas by policy {scaler.policy}{seen}",
        )
    ]


def _summary(name: str, values: Mapping[str, float]) -> str:
    top = max(values.values(), default=0.0)
    return f"{name} up to {top:g} on {len(values)} replica(s)"


def _named(key: Hashable) -> str:
    return f"application {key[1]}" if isinstance(key, tuple) else str(key)


def _number(value: object) -> float | None:
    """A finite real number (NumPy's too), not a bool, as a float; else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    return float(value)


def _deployment_answer(value: object) -> tuple[float, dict[str, Any]] | str:
    """A deployment policy's ``(replicas, policy_state)``, or what is wrong with it."""
    if isinstance(value, tuple | list) and len(value) == 2:
        wanted, policy_state = value
        number = _number(wanted)
        if number is not None and (policy_state is None or isinstance(policy_state, dict)):
            return number, dict(policy_state or {})
    return f"returned {_short(value)}, not (replicas, policy_state) with a number of replicas"


def _app_answer(
    value: object, deployments: set[DeploymentID]
) -> tuple[dict[DeploymentID, float], dict[DeploymentID, dict[str, Any]]] | str:
    """An application policy's ``({deployment: replicas}, {deployment: policy_state})``."""
    if not (isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], dict)):
        return f"returned {_short(value)}, not ({{deployment: replicas}}, {{deployment: policy_state}})"
    decisions_in, states_in = value
    decisions: dict[DeploymentID, float] = {}
    for deployment, wanted in decisions_in.items():
        number = _number(wanted)
        if deployment not in deployments:
            return f"decided for {deployment!r}, not an autoscaled deployment of the application"
        if number is None:
            return f"returned {_short(wanted)} for {deployment}, not a number of replicas"
        decisions[deployment] = number
    states: dict[DeploymentID, dict[str, Any]] = {}
    for deployment, policy_state in (states_in or {}).items() if isinstance(states_in, dict | None) else ():
        if deployment in deployments and isinstance(policy_state, dict):
            states[deployment] = policy_state
    return decisions, states


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
