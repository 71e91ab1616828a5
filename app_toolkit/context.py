"""Where the current code runs: ``get_replica_context()`` inside a replica,
``get_request_id()`` while it serves a request, ``api_key_name(request)``: who called,
``get_request_priority()``: its key's class, ``admit_key(request, name)``: an open route's
caller let in as a key, ``count_request(socket)``: a WebSocket's message counted as a
request of its key, and ``charge_tokens(request, n)``: what the caller's key is charged."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from app_toolkit._runtime import request_context, token_charges
from app_toolkit._runtime.front.scope import API_KEY_METERED, API_KEY_NAME
from app_toolkit._runtime.request_context import ReplicaContext, ReplicaRank
from app_toolkit.replica_id import ReplicaID

__all__ = [
    "ReplicaContext",
    "ReplicaID",
    "ReplicaRank",
    "admit_key",
    "api_key_name",
    "charge_tokens",
    "count_request",
    "get_replica_context",
    "get_request_id",
    "get_request_priority",
    "meters_tokens",
]


def get_replica_context() -> ReplicaContext:
    """The application, deployment and replica id of the replica running this code, its
    rank (``rank``, ``node_rank``, ``local_rank``) of ``world_size``, and Ray Serve's
    other fields: ``replica_tag``, ``servable_object``, ``code_version``, ``gang_context``.

    Works in constructors, routes and deployment methods; raises RuntimeError elsewhere.
    """
    context = request_context.replica.get()
    if context is None:
        raise RuntimeError("get_replica_context() works only inside a replica")
    return context


def get_request_id() -> str:
    """The id of the request this code serves: the one its response carries in
    ``x-request-id`` (the client's own, if it sent a usable one), which handle calls made
    for it carry too and its log lines show. "" outside a request.

    The app's request headers are the client's as sent; this is where the id is read
    (``HTTPOptions(request_id_headers=True)`` also puts it in the headers).
    """
    return request_context.current_request_id()


def get_request_priority() -> int:
    """The priority class of the request this code serves: its API key's ``priority``
    (``http_options.api_keys``; lower goes first, vLLM's meaning), carried through the
    handle calls made for it (unlike :func:`api_key_name`, which names a caller only where
    it presented its key: handles are trusted). 0 for a request without a key, outside a
    request, and in a ``@batch`` function (it serves several requests at once).

    A saturated deployment's callers serve waiting requests by it (docs/http.md, "Fair
    shares"); a model's engine may queue by it too (``app_toolkit.llm`` passes it to
    vLLM as the request's ``priority`` when vLLM's ``scheduling_policy`` is ``priority``).
    """
    share = request_context.current_share()
    return share.priority if share is not None else 0


def api_key_name(connection: HTTPConnection) -> str | None:
    """The name of the API key the request or WebSocket presented (``http_options.api_keys``),
    or None: keys are off, its route is open (``@open_route``) and it sent no valid key, or
    it came through a handle (handles inside the cluster are trusted). Also a FastAPI
    dependency: ``name: str | None = Depends(tk.api_key_name)``."""
    name = connection.scope.get(API_KEY_NAME)
    return name if isinstance(name, str) else None


async def admit_key(connection: HTTPConnection, name: str | None) -> bool:
    """Let a request or WebSocket of an open route (``@open_route``) in as the API key
    named ``name``, for an app that identified its caller by its own means (a signed
    sign-in cookie naming the key it signed in with, say): from here on it counts as if it
    had presented that key — under the key's limits (a concurrent slot held until it
    ends), with its share and class for the handle calls it makes, named by
    :func:`api_key_name`, its tokens charged by :func:`charge_tokens`.

    Returns True; False when the front asks for no keys (nothing is counted: let everyone
    in). Raises :class:`~app_toolkit.exceptions.APIKeyRefused` (an ``HTTPException``):
    401 when ``name`` is None or names no key (or an expired one), 429 over the key's
    limits, with the front's message and headers. A request that presented a key (or was
    let in already) is that key's: True, whatever ``name`` says (read who with
    :func:`api_key_name`). Call it from the route or a dependency, in the replica serving
    the request; the limits count it once."""
    from app_toolkit._runtime.front import key_door  # loaded with a front that asks for keys

    return await key_door.admit(connection.scope, name)


async def count_request(connection: HTTPConnection) -> None:
    """Count one more request of the API key ``connection`` came with (presented, or let
    in by :func:`admit_key`), for a WebSocket whose messages are requests: each is held to
    the key's ``requests_per_window`` and ``tokens_per_window`` (the socket itself, one
    request, holds its concurrent slot). Raises
    :class:`~app_toolkit.exceptions.APIKeyRefused` (429, with the front's headers and
    error) over them, 401 once the key is revoked or has expired: answer the message with
    it and go on, or close the socket. Nothing happens without a key or with keys off."""
    from app_toolkit._runtime.front import key_door

    await key_door.count(connection.scope)


def charge_tokens(caller: HTTPConnection | str, tokens: int) -> None:
    """Charge ``tokens`` to the API key of ``caller``, against its ``tokens_per_window``
    (``http_options.api_keys``): once a window's tokens are used, the key's requests get
    429 until it ends. ``caller``: the request (its key, presented or let in by
    :func:`admit_key`), or a key's name (work that outlives its request, as a reply
    generated in the background: handles are trusted). For an app whose replies use
    tokens (or any unit of cost) as it counts them; ``app_toolkit.llm`` charges each
    reply's prompt and completion tokens by itself. They count in
    ``app_toolkit_api_key_tokens_total{key}``; for a key with a tokens limit
    (:func:`meters_tokens`; by name: always) they also go to the controller, gathered for
    a tenth of a second. Nothing happens for a request without a key, or a name of ""."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a whole number, 0 or more (got {tokens!r})")
    if isinstance(caller, str):
        name: object = caller
        metered = True
    else:
        name = caller.scope.get(API_KEY_NAME)
        metered = bool(caller.scope.get(API_KEY_METERED))
    if not tokens or not isinstance(name, str) or not name:
        return
    token_charges.TOKENS.inc(name, amount=tokens)
    if metered:
        token_charges.CHARGES.add(name, tokens)


def meters_tokens(connection: HTTPConnection) -> bool:
    """Whether the request's API key has a tokens limit, so that :func:`charge_tokens`
    counts: an app may skip counting what it would charge otherwise."""
    return bool(connection.scope.get(API_KEY_METERED))
