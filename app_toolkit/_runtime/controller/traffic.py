"""Weighted traffic splits: which applications share an application's traffic, and how
much each gets. Pure: the controller keeps the result, callers apply it.

A split belongs to an *endpoint* application (its route and its handle). Each variant is
an application whose ingress takes that share of the endpoint's requests; the endpoint
may be one of its own variants. Callers see the split in the endpoint ingress's replica
table and pick a variant per request (``routing/choice.py``), with no extra hop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from app_toolkit._runtime.messages import AppSpec, DeploymentID
from app_toolkit.exceptions import ConfigError

#: Variant application -> its share (the shares of a split add up to 1).
Weights = tuple[tuple[str, float], ...]
#: What callers get: each variant's ingress and its share.
Split = tuple[tuple[DeploymentID, float], ...]


def normalize(endpoint: str, weights: Mapping[str, float], apps: Mapping[str, AppSpec]) -> Weights:
    """Check ``weights`` for ``endpoint`` and scale them to add up to 1 (given in any unit:
    ``{"v1": 90, "v2": 10}`` or ``{"v1": 0.9, "v2": 0.1}``). Raises ConfigError saying
    what to fix. A split that sends everything to the endpoint itself comes back empty."""
    if endpoint not in apps:
        raise ConfigError(f"No application {endpoint!r} to split the traffic of; deploy it first")
    if not weights:
        raise ConfigError(f"Give at least one application and its weight, e.g. {{{endpoint!r}: 100}}")
    for name, weight in weights.items():
        if name not in apps:
            known = ", ".join(sorted(apps)) or "none"
            raise ConfigError(
                f"Traffic of {endpoint!r} cannot go to {name!r}: no such application (running: {known})"
            )
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
            raise ConfigError(f"The weight of {name!r} must be a number, got {weight!r}")
        if weight < 0:
            raise ConfigError(f"The weight of {name!r} must not be negative, got {weight}")
    total = float(sum(weights.values()))
    if total <= 0:
        raise ConfigError("At least one weight must be above zero")
    shares = tuple(sorted((name, weight / total) for name, weight in weights.items() if weight > 0))
    if shares == ((endpoint, 1.0),):
        return ()
    return shares


def without(traffic: Mapping[str, Weights], gone: str) -> dict[str, Weights]:
    """The splits once application ``gone`` is deleted: its own split ends, and it is no
    longer a variant of the others (their other variants share its weight)."""
    kept: dict[str, Weights] = {}
    for endpoint, shares in traffic.items():
        if endpoint == gone:
            continue
        rest = [(name, share) for name, share in shares if name != gone]
        total = sum(share for _, share in rest)
        if rest and total > 0:
            rescaled = tuple((name, share / total) for name, share in rest)
            if rescaled != ((endpoint, 1.0),):
                kept[endpoint] = rescaled
    return kept


def split_for(shares: Weights, apps: Mapping[str, AppSpec]) -> Split:
    """The split as callers apply it: each variant's ingress deployment."""
    return tuple((DeploymentID(name, apps[name].ingress), share) for name, share in shares if name in apps)
