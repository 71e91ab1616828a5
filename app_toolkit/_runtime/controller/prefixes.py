"""Route prefixes of applications side by side: the controller refuses one app that would
hide another's routes (the proxy picks the longest prefix). Pure."""

from __future__ import annotations

from collections.abc import Sequence

from app_toolkit._runtime.messages import AppSpec
from app_toolkit.exceptions import ConfigError


def check_all_prefixes(specs: Sequence[AppSpec], others: Sequence[AppSpec] = ()) -> None:
    """Check ``specs`` (deployed in one step) against each other and against ``others``
    (the running applications they do not replace), before any is deployed."""
    for index, spec in enumerate(specs):
        for other in [*specs[index + 1 :], *others]:
            check_prefixes(spec, other)


def check_prefixes(new: AppSpec, other: AppSpec) -> None:
    """Refuse an app whose prefix equals another's or hides some of its routes."""
    if new.route_prefix is None or other.route_prefix is None:
        return
    if new.route_prefix == other.route_prefix:
        raise ConfigError(
            f"route_prefix {new.route_prefix!r} is already used by application "
            f"{other.name!r}; choose another prefix or delete {other.name!r} first"
        )
    for outer, inner in ((other, new), (new, other)):
        assert outer.route_prefix is not None and inner.route_prefix is not None
        if not inner.route_prefix.startswith(outer.route_prefix.rstrip("/") + "/"):
            continue  # inner is not below outer, so it cannot hide outer's routes
        for path in outer.paths:
            full = outer.route_prefix.rstrip("/") + path
            fixed = full.split("{", 1)[0]  # the part before any path parameter
            if fixed == inner.route_prefix or fixed.startswith(inner.route_prefix.rstrip("/") + "/"):
                raise ConfigError(
                    f"Route {full} of application {outer.name!r} would be hidden by application "
                    f"{inner.name!r} at route_prefix {inner.route_prefix!r} (the longest prefix "
                    "wins); choose another route_prefix or move the route"
                )
