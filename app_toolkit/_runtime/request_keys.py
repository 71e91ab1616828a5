"""The keys a request names to choose its replica, and the HTTP headers that carry them:
the one home of their names and of which one wins when a request sends more than one.

- **Multiplexed model**: Ray Serve's ``serve_multiplexed_model_id``, or its hyphen form
  ``serve-multiplexed-model-id`` (nginx drops headers with underscores by default, and
  many proxies rewrite ``_`` to ``-``).
- **Session**: Ray Serve's ``x-session-id``, or ``x_session_id``.
- **Shard key**: ``x-serve-shard-key`` (``HTTPOptions.shard_key_header`` names another).

As in Ray Serve's proxy, the two forms of a name are one header, and of several lines of
one header the last counts (a line with an empty value counts as not sent).

A session id is a shard key by another name: requests with one session id go to one
replica, as requests with one shard key do. A request that sends both is routed by its
shard key (:func:`routing_key`).

Header names are compared as ASGI servers give them: lower-case, whatever case the client
sent. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The multiplexed model's header, Ray Serve's name.
MODEL_ID_HEADER = b"serve_multiplexed_model_id"
#: The same header as proxies that refuse or rewrite underscores pass it on.
MODEL_ID_HEADER_HYPHEN = b"serve-multiplexed-model-id"

#: The session's header, Ray Serve's name.
SESSION_ID_HEADER = b"x-session-id"
SESSION_ID_HEADER_UNDERSCORE = b"x_session_id"

#: The shard key's header, unless ``HTTPOptions.shard_key_header`` names another.
SHARD_KEY_HEADER = b"x-serve-shard-key"

#: Every header name :class:`KeyHeaders` reads.
KEY_HEADERS = frozenset(
    {MODEL_ID_HEADER, MODEL_ID_HEADER_HYPHEN, SESSION_ID_HEADER, SESSION_ID_HEADER_UNDERSCORE}
)


class KeyHeaders:
    """The key headers of one request, fed one by one as a server's pass over its headers
    meets them (:meth:`add`); then :attr:`model_id` and :attr:`session_id` say what the
    request asks for ("" for nothing). Either form of a name is the same header; the last
    line with a value counts."""

    __slots__ = ("model_id", "session_id")

    def __init__(self) -> None:
        self.model_id = self.session_id = ""

    def add(self, name: bytes, value: bytes) -> None:
        """Take header ``name`` (one of :data:`KEY_HEADERS`; others are ignored)."""
        if not value:
            return
        if name == MODEL_ID_HEADER or name == MODEL_ID_HEADER_HYPHEN:
            self.model_id = value.decode("latin-1")
        elif name == SESSION_ID_HEADER or name == SESSION_ID_HEADER_UNDERSCORE:
            self.session_id = value.decode("latin-1")


def model_id_in(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The multiplexed model an HTTP or WebSocket scope's ``headers`` name ("" if none)."""
    keys = KeyHeaders()
    for name, value in headers:
        if name in KEY_HEADERS:
            keys.add(name, value)
    return keys.model_id


def routing_key(shard_key: str, session_id: str) -> str:
    """The key that picks a request's replica: its shard key, else its session id ("":
    neither, the replica is chosen by load)."""
    return shard_key or session_id
