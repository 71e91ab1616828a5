"""Weighted traffic splits: which variants share an endpoint's traffic, and how much
each gets. Pure: the controller keeps the result, callers apply it.

An endpoint is an application (its route and its handle; the variants are applications,
each taking its share through its ingress) or one deployment of an application, named
``"app/Deployment"`` (the calls to it through handles; the variants are deployments of the
same application). The endpoint may be one of its own variants. Callers see the split in
the endpoint's replica table and pick a variant per request (``routing/choice.py``), with
no extra hop.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from app_toolkit._runtime.controller.rollout import Rollout
from app_toolkit._runtime.messages import AppSpec, DeploymentID
from app_toolkit._runtime.tables import ShadowOutcome, ShadowTarget, VariantOutcome
from app_toolkit.config import ShadowOptions, parse_options
from app_toolkit.exceptions import ConfigError
from app_toolkit.metrics import SECONDS_BUCKETS, quantile
from app_toolkit.status import RolloutStatusInfo, ShadowStatusInfo

#: Variant -> its share (the shares of a split add up to 1).
Weights = tuple[tuple[str, float], ...]
#: What the checkpoint keeps of the policies: the splits and the shadows.
SavedPolicy = tuple[dict[str, Weights], dict[str, tuple[str, float, str]]]
#: What callers get: each variant's deployment and its share.
Split = tuple[tuple[DeploymentID, float], ...]


def endpoint_of(endpoint: str, apps: Mapping[str, AppSpec]) -> DeploymentID:
    """The deployment whose callers apply ``endpoint``'s split. Raises ConfigError."""
    app_name, _, deployment = endpoint.partition("/")
    app = apps.get(app_name)
    if app is None:
        raise ConfigError(f"No application {app_name!r} to split the traffic of; deploy it first")
    if not deployment:
        return DeploymentID(app.name, app.ingress)
    if deployment == app.ingress:
        raise ConfigError(f"{deployment!r} is {app_name!r}'s ingress: split the application, {app_name!r}")
    if deployment not in {d.id.name for d in app.deployments}:
        raise ConfigError(f"Application {app_name!r} has no deployment {deployment!r}")
    return DeploymentID(app.name, deployment)


def variant_of(endpoint: str, name: str, apps: Mapping[str, AppSpec]) -> DeploymentID | None:
    """The deployment that variant ``name`` of ``endpoint`` stands for (None: no such)."""
    app_name, _, deployment = endpoint.partition("/")
    if not deployment:
        app = apps.get(name)
        return DeploymentID(app.name, app.ingress) if app is not None else None
    app = apps.get(app_name)
    if app is None or name not in {d.id.name for d in app.deployments}:
        return None
    return DeploymentID(app_name, name)


def normalize(endpoint: str, weights: Mapping[str, float], apps: Mapping[str, AppSpec]) -> Weights:
    """Check ``weights`` for ``endpoint`` and scale them to add up to 1 (given in any unit:
    ``{"v1": 90, "v2": 10}`` or ``{"v1": 0.9, "v2": 0.1}``). Raises ConfigError saying
    what to fix. A split that sends everything to the endpoint itself comes back empty."""
    endpoint_of(endpoint, apps)
    app_name, _, deployment = endpoint.partition("/")
    kind = f"deployment of {app_name!r}" if deployment else "application"
    if not weights:
        raise ConfigError(
            f"Give at least one {kind} and its weight, e.g. {{{deployment or endpoint!r}: 100}}"
        )
    for name, weight in weights.items():
        if variant_of(endpoint, name, apps) is None:
            raise ConfigError(f"Traffic of {endpoint!r} cannot go to {name!r}: no such {kind}")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
            raise ConfigError(f"The weight of {name!r} must be a number, got {weight!r}")
        if weight < 0:
            raise ConfigError(f"The weight of {name!r} must not be negative, got {weight}")
    total = float(sum(weights.values()))
    if total <= 0:
        raise ConfigError("At least one weight must be above zero")
    shares = tuple((name, weight / total) for name, weight in weights.items() if weight > 0)
    if shares == ((deployment or endpoint, 1.0),):
        return ()
    return shares


def without(traffic: Mapping[str, Weights], gone: str) -> dict[str, Weights]:
    """The splits once application ``gone`` is deleted: its own splits end, and it is no
    longer a variant of the others (their other variants share its weight)."""
    kept: dict[str, Weights] = {}
    for endpoint, shares in traffic.items():
        app_name, _, deployment = endpoint.partition("/")
        if app_name == gone:
            continue
        rest = [(name, share) for name, share in shares if deployment or name != gone]
        total = sum(share for _, share in rest)
        if rest and total > 0:
            rescaled = tuple((name, share / total) for name, share in rest)
            if rescaled != ((endpoint, 1.0),):
                kept[endpoint] = rescaled
    return kept


def split_for(endpoint: str, shares: Weights, apps: Mapping[str, AppSpec]) -> Split:
    """The split as callers apply it: each variant's deployment, shares scaled again over
    the variants that still exist (a redeploy may have removed one)."""
    found = [(variant_of(endpoint, name, apps), share) for name, share in shares]
    live = [(deployment, share) for deployment, share in found if deployment is not None]
    total = sum(share for _, share in live)
    return tuple((deployment, share / total) for deployment, share in live) if total > 0 else ()


@dataclass
class Shadowing:
    """A shadow of an application and what its copies did since it was set."""

    to: str
    fraction: float
    compare: str = ""
    copies: int = 0
    errors: int = 0
    different: int = 0
    dropped: int = 0
    counts: list[int] = field(default_factory=lambda: [0] * (len(SECONDS_BUCKETS) + 1))
    primary_counts: list[int] = field(default_factory=lambda: [0] * (len(SECONDS_BUCKETS) + 1))

    def add(self, outcome: ShadowOutcome) -> None:
        self.copies += outcome.copies
        self.errors += outcome.errors
        self.different += outcome.different
        self.dropped += outcome.dropped
        for counts, more in (
            (self.counts, outcome.latency_counts),
            (self.primary_counts, outcome.primary_latency_counts),
        ):
            for index, count in enumerate(more[: len(counts)]):
                counts[index] += count

    def info(self) -> ShadowStatusInfo:
        return ShadowStatusInfo(
            to=self.to,
            fraction=self.fraction,
            compare=self.compare,
            copies=self.copies,
            errors=self.errors,
            different=self.different,
            dropped=self.dropped,
            p50_ms=_quantile_ms(self.counts, 0.5),
            p99_ms=_quantile_ms(self.counts, 0.99),
            primary_p50_ms=_quantile_ms(self.primary_counts, 0.5),
            primary_p99_ms=_quantile_ms(self.primary_counts, 0.99),
        )


def _quantile_ms(counts: list[int], q: float) -> float | None:
    cumulative, total = [], 0
    for bound, count in zip((*SECONDS_BUCKETS, math.inf), counts, strict=True):
        total += count
        cumulative.append((bound, float(total)))
    found = quantile(cumulative, q)
    return None if found is None else found * 1000


class TrafficPolicy:
    """Every application's split, rollout and shadow, as the controller keeps them."""

    def __init__(
        self,
        traffic: dict[str, Weights] | None = None,
        shadows: dict[str, tuple[str, float, str]] | None = None,
    ) -> None:
        self.traffic: dict[str, Weights] = dict(traffic or {})
        self.rollouts: dict[str, Rollout] = {}
        self.shadows: dict[str, Shadowing] = {
            endpoint: Shadowing(*saved) for endpoint, saved in (shadows or {}).items()
        }

    def saved(self) -> SavedPolicy:
        """What the checkpoint keeps: the splits and the shadows."""
        return self.traffic, {e: (s.to, s.fraction, s.compare) for e, s in self.shadows.items()}

    def set_shadow(
        self,
        endpoint: str,
        to: str | None,
        fraction: float,
        apps: Mapping[str, AppSpec],
        compare: str = "",
    ) -> str:
        """Copy ``fraction`` of ``endpoint``'s requests to ``to`` (None or 0: stop),
        comparing answers with the function ``compare`` names if given; returns the event.
        Raises ConfigError saying what to fix."""
        if endpoint not in apps:
            raise ConfigError(f"No application {endpoint!r} to shadow; deploy it first")
        if to is None or fraction == 0:
            self.shadows.pop(endpoint, None)
            return f"Shadow of {endpoint} stopped"
        if to not in apps:
            raise ConfigError(f"No application {to!r} to send {endpoint!r}'s copies to; deploy it first")
        if to == endpoint:
            raise ConfigError("An application cannot shadow itself; deploy the shadow as another application")
        options = parse_options(ShadowOptions, {"fraction": fraction, "compare": compare}, "shadow")
        self.shadows[endpoint] = Shadowing(to, options.fraction, options.compare)
        return f"Shadow of {endpoint}: {fraction:.0%} of its requests copied to {to}"

    def shadow(self, app: AppSpec, apps: Mapping[str, AppSpec]) -> ShadowTarget | None:
        shadowing = self.shadows.get(app.name)
        if shadowing is None or shadowing.to not in apps:
            return None
        ingress = DeploymentID(shadowing.to, apps[shadowing.to].ingress)
        return ShadowTarget(ingress, shadowing.fraction, shadowing.compare)

    def set(self, endpoint: str, weights: Mapping[str, float], apps: Mapping[str, AppSpec]) -> str:
        """Set a split by hand (it stops a rollout of ``endpoint``); returns what changed,
        for the events. Raises ConfigError."""
        self._set(endpoint, weights, apps)
        rollout = self.rollouts.get(endpoint)
        if rollout is not None:
            rollout.stop("the traffic was set by hand")
        return self._describe(endpoint)

    def start_rollout(self, rollout: Rollout, apps: Mapping[str, AppSpec]) -> str:
        """Begin ``rollout`` (replacing one under way); returns its first event."""
        self._set(rollout.endpoint, rollout.weights(), apps)
        previous = self.rollouts.get(rollout.endpoint)
        if previous is not None:
            previous.stop("another rollout started")
        self.rollouts[rollout.endpoint] = rollout
        steps = ", ".join(f"{s:g}" for s in rollout.steps)
        name = f"Rollout of {rollout.endpoint} to {rollout.canary}"
        return f"{name} started: steps {steps} %; {self._describe(rollout.endpoint)}"

    def record(self, outcome: VariantOutcome | ShadowOutcome) -> None:
        if isinstance(outcome, ShadowOutcome):
            shadowing = self.shadows.get(outcome.endpoint)
            if shadowing is not None and shadowing.to == outcome.shadow:
                shadowing.add(outcome)
            return
        rollout = self.rollouts.get(outcome.endpoint)
        if rollout is not None:
            rollout.record(outcome)

    def tick(self, now: float, apps: Mapping[str, AppSpec]) -> list[tuple[int, str]]:
        """Move rollouts on; returns the events (level, message) of what changed."""
        events: list[tuple[int, str]] = []
        for rollout in self.rollouts.values():
            change = rollout.advance(now)
            if change is None:
                continue
            try:
                self._set(rollout.endpoint, rollout.weights(), apps)
            except ConfigError as exc:
                rollout.stop(str(exc))
                events.append((logging.WARNING, f"Rollout of {rollout.endpoint} stopped: {exc}"))
                continue
            name = f"Rollout of {rollout.endpoint} to {rollout.canary}"
            if change == "rollback":
                events.append((logging.ERROR, f"{name} rolled back: {rollout.reason}"))
            elif change == "done":
                events.append((logging.INFO, f"{name} done: {rollout.history[-1]}"))
            else:
                now_split = self._describe(rollout.endpoint)
                events.append((logging.INFO, f"{name}: {rollout.history[-1]}; now {now_split}"))
        return events

    def app_removed(self, name: str) -> None:
        self.traffic = without(self.traffic, name)
        self.shadows = {e: s for e, s in self.shadows.items() if name not in (e, s.to)}
        for rollout in self.rollouts.values():
            if name in (rollout.endpoint, rollout.canary):
                rollout.stop(f"{name} was deleted")
        self.rollouts.pop(name, None)

    def split(self, deployment: DeploymentID, apps: Mapping[str, AppSpec]) -> Split:
        """The split the callers of ``deployment`` apply (empty: none)."""
        app = apps.get(deployment.app)
        if app is None:
            return ()
        endpoint = app.name if deployment.name == app.ingress else str(deployment)
        shares = self.traffic.get(endpoint)
        return split_for(endpoint, shares, apps) if shares else ()

    def endpoints(self, apps: Mapping[str, AppSpec]) -> list[DeploymentID]:
        """The deployments whose tables carry a split or a shadow (or may have, until the
        next publish): every application's ingress and every split deployment."""
        found = [DeploymentID(app.name, app.ingress) for app in apps.values()]
        for endpoint in self.traffic:
            if "/" in endpoint:
                app_name, _, name = endpoint.partition("/")
                found.append(DeploymentID(app_name, name))
        return found

    def deployment_traffic(self, app: str) -> dict[str, dict[str, float]]:
        """The splits of ``app``'s deployments: deployment -> (variant -> share)."""
        prefix = app + "/"
        return {
            endpoint[len(prefix) :]: dict(shares)
            for endpoint, shares in self.traffic.items()
            if endpoint.startswith(prefix)
        }

    def status(
        self, name: str, now: float
    ) -> tuple[dict[str, float], RolloutStatusInfo | None, ShadowStatusInfo | None]:
        """Application ``name``'s split, its latest rollout and its shadow, for status()."""
        traffic = dict(self.traffic.get(name, ()))
        shadowing = self.shadows.get(name)
        shadow = shadowing.info() if shadowing is not None else None
        rollout = self.rollouts.get(name)
        if rollout is None:
            return traffic, None, shadow
        return (
            traffic,
            RolloutStatusInfo(
                canary=rollout.canary,
                steps=list(rollout.steps),
                step=rollout.step,
                state=rollout.state,
                message=rollout.reason,
                canary_requests=rollout.requests,
                canary_errors=rollout.errors,
                canary_p99_ms=rollout.p99_ms(),
                step_age_s=now - rollout.step_started,
                history=list(rollout.history),
            ),
            shadow,
        )

    def _set(self, endpoint: str, weights: Mapping[str, float], apps: Mapping[str, AppSpec]) -> None:
        shares = normalize(endpoint, weights, apps)
        if shares:
            self.traffic[endpoint] = shares
        else:
            self.traffic.pop(endpoint, None)

    def _describe(self, endpoint: str) -> str:
        shares = self.traffic.get(endpoint, ())
        split = ", ".join(f"{name} {share:.1%}" for name, share in shares) or f"all to {endpoint}"
        return f"traffic of {endpoint}: {split}"
