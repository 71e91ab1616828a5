"""How a deployment's class marks its continuable generator methods (``@continuable``,
app_toolkit/continuable.py): read where an app is built (their rules, for its callers,
who get them with the deployment's wait) and in a replica continuing a stream (the
method's ``continue_from``)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence

from app_toolkit._runtime.messages import StreamContinuation

#: The attribute ``@continuable`` puts on the method: its ``continue_from`` function.
CONTINUE_FROM = "__app_toolkit_continue_from__"
#: The attribute with the method's rules: (limit, max_items, wait_s, max_bytes).
RULES = "__app_toolkit_continuation__"


def continuations_of(definition: object) -> tuple[StreamContinuation, ...]:
    """The continuable methods of a deployment's class, by name (none for a function)."""
    if not inspect.isclass(definition):
        return ()
    found = []
    for name, member in inspect.getmembers(definition):
        rules = getattr(member, RULES, None)
        if rules is not None and not name.startswith("_"):
            limit, max_items, wait_s, max_bytes = rules
            found.append(StreamContinuation(name, limit, max_items, wait_s, max_bytes))
    return tuple(found)


def waiting(rules: tuple[StreamContinuation, ...], wait_s: float | None) -> tuple[StreamContinuation, ...]:
    """The rules as a deployment's callers get them: each waiting ``wait_s`` (the
    deployment's ``continuation_wait_s``) where it is set, else what its method declares."""
    if wait_s is None:
        return rules
    return tuple(dataclasses.replace(rule, wait_s=wait_s) for rule in rules)


def continue_from_of(method: Callable[..., object]) -> Callable[[object, Sequence[object]], object] | None:
    """The ``continue_from`` of a (bound) continuable method; None for any other."""
    found = getattr(method, CONTINUE_FROM, None)
    return found if callable(found) else None
