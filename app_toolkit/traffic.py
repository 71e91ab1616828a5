"""Traffic policies of running applications: weighted splits, canary rollouts, shadow
copies (``docs/traffic.md``). Every caller applies them per request from the tables the
controller publishes; nothing restarts."""

from __future__ import annotations

from collections.abc import Sequence

from app_toolkit._runtime.backends.base import current_session, session_factory
from app_toolkit._runtime.session import Session
from app_toolkit.config import RolloutOptions, ShadowOptions, default_of, parse_options
from app_toolkit.exceptions import ConfigError

__all__ = ["rollout", "set_traffic", "shadow"]


def set_traffic(app: str, weights: dict[str, float]) -> None:
    """Split the traffic of application ``app`` (its route and its handle) between
    applications by weight, e.g. ``set_traffic("chat", {"chat": 90, "chat-v2": 10})``.
    Weights are in any unit (they are scaled to add up to 1); ``app`` may be one of its
    own variants, and ``{app: 1}`` ends the split. ``app`` may also name one deployment,
    ``"app/Model"``: the calls to it through handles are split between deployments of the
    same application (``{"Model": 90, "ModelV2": 10}``). Every caller applies it per request
    from its next table update (well under a second); nothing restarts. A request with a
    shard key sees the same variant while the weights stay the same."""
    session = _running("splitting traffic")
    session.set_traffic(app, dict(weights))


def rollout(
    app: str,
    *,
    to: str,
    steps: Sequence[float] = default_of(RolloutOptions, "steps"),
    interval_s: float = default_of(RolloutOptions, "interval_s"),
    max_error_rate: float | None = default_of(RolloutOptions, "max_error_rate"),
    max_p99_ms: float | None = default_of(RolloutOptions, "max_p99_ms"),
) -> None:
    """Move application ``app``'s traffic to the application ``to`` step by step: ``steps``
    are the canary's percentages, each held for ``interval_s``. While a step runs, the
    canary's requests are watched (at every caller); when more than ``max_error_rate`` of
    them fail, or their p99 latency exceeds ``max_p99_ms``, the traffic goes back to
    ``app`` at once. Returns when the first step is in place; ``status()`` shows the
    steps and, after a rollback, why."""
    session = _running("a rollout")
    options = {
        "steps": tuple(steps),
        "interval_s": interval_s,
        "max_error_rate": max_error_rate,
        "max_p99_ms": max_p99_ms,
    }
    session.rollout(app, to, parse_options(RolloutOptions, options, "rollout"))


def shadow(
    app: str,
    *,
    to: str | None,
    fraction: float = default_of(ShadowOptions, "fraction"),
    compare: str | None = None,
) -> None:
    """Copy ``fraction`` of application ``app``'s requests (HTTP and handle calls) to the
    application ``to``: its answers are compared with the primary's (status, latency)
    into ``status()`` and thrown away. ``compare`` ("module:function" or
    "module.function") also compares bodies: it gets the primary's and the shadow's (HTTP
    body bytes, or call results) and returns whether they agree. The primary never waits
    for its shadow; copies the shadow cannot take in time are dropped and counted. Streams
    and WebSockets are not copied. ``to=None`` stops it."""
    session = _running("a shadow")
    session.shadow(app, to, fraction, compare or "")


def _running(what: str) -> Session:
    session = current_session(create=False) or session_factory("auto").find(None)
    if session is None:
        raise ConfigError(f"Nothing is running: deploy the applications before {what}")
    return session
