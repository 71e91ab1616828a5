"""What the CLI's commands share: failing with a message, reading KEY=VALUE arguments,
and reaching the toolkit that runs on a cluster."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import click

from app_toolkit._runtime.backends.base import session_factory
from app_toolkit._runtime.session import Session
from app_toolkit.exceptions import AppToolkitError, ConfigError


def fail(exc: Exception) -> NoReturn:
    """Print ``exc`` as the command's error and exit with status 1."""
    click.echo(f"Error: {exc}", err=True)
    sys.exit(1)


def key_values(pairs: Sequence[str], example: str) -> dict[str, str]:
    """``KEY=VALUE`` arguments (``run``'s builder arguments, ``new``'s template variables)
    as a dict: the value is everything after the first ``=`` (it may be empty), the last
    of a key wins; a ConfigError names an argument without a key or an ``=``."""
    found: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f'"{pair}" must look like key=value, e.g. {example}')
        found[key.strip()] = value
    return found


def no_cluster(address: str, exc: Exception) -> ConfigError:
    """The error for a Ray cluster ``address`` that could not be joined, with the way out
    of the usual cause: Ray (2.59 on) starts its clusters with token authentication, and a
    client joining by an explicit address (``--address host:port`` or ``RAY_ADDRESS``)
    uses it only when ``RAY_AUTH_MODE=token``."""
    given = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    where = f"{address!r} (RAY_ADDRESS={given!r})" if address == "auto" and given else repr(address)
    hint = "start one with `ray start --head` or pass --address"
    if isinstance(exc, ConnectionError) and given not in ("", "auto") and "RAY_AUTH_MODE" not in os.environ:
        hint += (
            "; if the cluster uses Ray's token authentication (from Ray 2.59 on, clusters"
            " ray.init() starts do), set RAY_AUTH_MODE=token, with the cluster's token in"
            " ~/.ray/auth_token or RAY_AUTH_TOKEN"
        )
    return ConfigError(f"No Ray cluster at {where} ({exc}); {hint}")


def find(address: str) -> Session | None:
    """The toolkit running on the Ray cluster at ``address`` (None: not running there)."""
    try:
        return session_factory("ray").find(address)
    except ConfigError as exc:  # the cluster's Ray or Python differs: its own message says what to do
        fail(exc)
    except Exception as exc:  # noqa: BLE001 - ray.init failing to find a cluster
        fail(no_cluster(address, exc))


def act(address: str, action: Callable[[Session], None]) -> Session:
    """Run ``action`` on the toolkit running on the cluster at ``address``; exit with the
    error's message if there is none or the action is refused."""
    session = find(address)
    if session is None:
        fail(ConfigError("app_toolkit is not running on this cluster"))
    try:
        action(session)
    except AppToolkitError as exc:
        fail(exc)
    return session
