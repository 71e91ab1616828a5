"""An open route's way in as an API key (``app_toolkit.admit_key``): the app identified
its caller by its own means (a signed sign-in cookie, say) and lets the request in as that
caller's key — under the key's limits, with its share, named by ``api_key_name`` — as if
it had presented the key to the front.

Each process that runs apps with API keys on has one door: the key ring and limits of the
front it runs (the node's proxy, an ingress replica serving handed-off connections, the
local backend's proxy), or, in a replica without a front, its own (``ReplicaStart.keys``).
Either way the limits are the cluster's ledger's, the same as for requests the front
admits. A concurrent slot taken here is given back when the request's scope ends
(``request_context``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from starlette.types import Scope

from app_toolkit._runtime.front.key_check import REFUSED, KeyRing, unauthorized
from app_toolkit._runtime.front.key_limits import KeyLimits
from app_toolkit._runtime.front.scope import API_KEY_NAME
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit._runtime.request_values import CURRENT
from app_toolkit.exceptions import APIKeyRefused

#: The refusal's headers an app's answer keeps (the rest are the front's own framing).
_KEPT = (b"www-authenticate", b"retry-after")


@dataclass(frozen=True, slots=True)
class KeyDoor:
    """This process's API keys and its share of their limits."""

    keys: KeyRing
    limits: KeyLimits


_installed: KeyDoor | None = None


def install(door: KeyDoor) -> None:
    """``door`` is this process's (the last front or replica to start with keys on)."""
    global _installed
    _installed = door


def uninstall(door: KeyDoor) -> None:
    """``door``'s front or replica has stopped."""
    global _installed
    if _installed is door:
        _installed = None


def installed() -> KeyDoor | None:
    """This process's door; None: it serves no app with API keys on."""
    return _installed


async def admit(scope: Scope, name: str | None) -> bool:
    """Let the request of ``scope`` in as the key named ``name`` (None: the app found no
    caller): True, or raise :class:`APIKeyRefused` (401: no such key, 429: over its
    limits). False with API keys off (nothing is counted). A request that presented a key
    (or was let in already) is that key's: True, whatever ``name`` says. Nothing of the
    key goes into ``scope`` unless it is let in."""
    door = _installed
    if door is None:
        return False
    values = CURRENT.get()
    if values is None:
        raise RuntimeError("admit_key works only in a route or dependency serving the request")
    if isinstance(scope.get(API_KEY_NAME), str) or values.leave is not None:
        return True  # (a middleware's copy of the scope: the request was let in already)
    found = door.keys.named(name) if name is not None else None
    if found is None:
        REFUSED.inc()
        raise refusal(unauthorized(values.request_id))
    limits = door.keys.limits_of(found.name)
    if limits is not None:
        over = await door.limits.enter(limits, values.request_id)
        if over is not None:
            raise refusal(over)
        values.leave = lambda: door.limits.leave(limits)
    door.keys.let_in(scope, found)
    door.keys.meter(scope, limits)
    values.share = found.share  # its handle calls wait as the key's
    return True


async def count(scope: Scope) -> None:
    """Count one more request of the key the connection of ``scope`` was let in as (a
    WebSocket whose messages are requests): its requests and tokens limits, not its
    concurrent one (the connection holds its slot). Raises :class:`APIKeyRefused`: 429
    over them, 401 once the key is revoked or expired; nothing without a key, or with
    keys off."""
    door = _installed
    name = scope.get(API_KEY_NAME)
    if door is None or not isinstance(name, str):
        return
    values = CURRENT.get()
    request_id = values.request_id if values is not None else ""
    if door.keys.named(name) is None:  # revoked or expired while the socket was open
        raise refusal(unauthorized(request_id))
    limits = door.keys.limits_of(name)
    if limits is None or not (limits.requests or limits.tokens):
        return
    over = await door.limits.enter(limits, request_id, slot=False)
    if over is not None:
        raise refusal(over)


def refusal(answer: HTTPResponse) -> APIKeyRefused:
    """The front's refusal ``answer`` (401, 429) as the exception an app raises."""
    error = json.loads(answer.body)["error"]
    headers = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in answer.headers
        if name in _KEPT or name.startswith(b"x-ratelimit-")
    }
    return APIKeyRefused(answer.status, error, headers)
