"""``@continuable``: a generator method whose stream goes on when its replica is lost.

A caller streaming a continuable method keeps the items it has received. When the
replica producing them is lost (its process killed, its node gone, declared dead by its
health check), or its engine stops under it, the caller sends the call again to another
replica with those items; there the method's ``continue_from(request, produced)`` makes
the request that produces the rest, and the caller's stream goes on with it, as if
nothing had happened (docs/fault-tolerance.md, "Streams that go on").

A replica that is only slow is never continued elsewhere: only a lost connection to it,
or the stream ending with ``ReplicaUnavailableError``, continues a stream.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TypeVar

from app_toolkit._runtime.continuation_marks import CONTINUE_FROM, RULES
from app_toolkit._runtime.messages import CONTINUATION_MAX_BYTES
from app_toolkit.exceptions import DefinitionError

F = TypeVar("F", bound=Callable[..., object])
Q = TypeVar("Q")  # the request a continuable method takes first
T = TypeVar("T")  # the items it yields

#: Continuations of one stream, at most (each after a loss).
DEFAULT_LIMIT = 3
#: Items a caller keeps to continue a stream; a longer stream is no longer continued.
DEFAULT_MAX_ITEMS = 65_536
#: How long a continuation waits for a replica to take it (a lost one's replacement).
DEFAULT_WAIT_S = 60.0
#: Bytes of items a caller keeps to continue a stream (their size as they crossed the
#: channel, pickled, 128 more per item); a longer stream is no longer continued.
DEFAULT_MAX_BYTES = CONTINUATION_MAX_BYTES


def continuable(
    continue_from: Callable[[Q, Sequence[T]], Q],
    *,
    limit: int = DEFAULT_LIMIT,
    max_items: int = DEFAULT_MAX_ITEMS,
    wait_s: float = DEFAULT_WAIT_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Callable[[F], F]:
    """Declare a deployment's generator method continuable.

    ``continue_from(request, produced)`` gets the call's first argument and the items the
    caller received before the loss, in order, and returns the first argument of the
    call that yields the items after them (the other arguments stay as they were). It
    runs in the replica that continues the stream. A continued stream is continued again
    if lost again, ``limit`` times at most. A caller keeps at most ``max_items`` items of
    a stream, and ``max_bytes`` of them (their size as they crossed the channel, pickled,
    and 128 bytes per item; 128 each on the local backend, where items do not cross
    one): past either, the stream is no longer continued and a loss ends it as an
    uncontinued one. A continuation waits ``wait_s`` at most for a replica to take it
    (with one replica, its replacement; a deployment's ``continuation_wait_s`` option
    replaces it), then the stream ends with the loss's error. Continuations go ahead of
    new requests in the caller's queue, and are counted in
    ``app_toolkit_stream_continuations_total``."""
    if not callable(continue_from):
        raise DefinitionError(
            f"@continuable takes the function that continues a stream; got {continue_from!r}"
        )
    if limit < 1 or max_items < 1 or max_bytes < 1 or not 0 < wait_s < float("inf"):
        raise DefinitionError(
            f"@continuable: limit, max_items and max_bytes must be at least 1 and wait_s a "
            f"number above 0; got limit={limit}, max_items={max_items}, max_bytes={max_bytes}, "
            f"wait_s={wait_s}"
        )

    def declare(method: F) -> F:
        if not (inspect.isasyncgenfunction(method) or inspect.isgeneratorfunction(method)):
            raise DefinitionError(
                f"@continuable applies to a generator method (one that yields); "
                f"{getattr(method, '__qualname__', method)!r} is not one"
            )
        setattr(method, CONTINUE_FROM, continue_from)
        setattr(method, RULES, (limit, max_items, wait_s, max_bytes))
        return method

    return declare
