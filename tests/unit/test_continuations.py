"""``@continuable`` and a caller's continuation of a stream: which errors continue it
(a lost replica, one gone under it; never a slow one, a refusal or a cancellation), its
limit, its item bound, the class it waits in, and what the decorator refuses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

import app_toolkit as tk
from app_toolkit._runtime.continuation_marks import continuations_of, continue_from_of
from app_toolkit._runtime.messages import DeploymentID, MethodCall, StreamContinuation
from app_toolkit._runtime.request_values import Share
from app_toolkit._runtime.routing.continuations import CONTINUATION_CLASS, Continuation
from app_toolkit.exceptions import (
    BackPressureError,
    DefinitionError,
    ReplicaUnavailableError,
    RequestLostError,
    RequestTimeoutError,
)

DEPLOYMENT = DeploymentID("app", "Model")
LOST = RequestLostError("lost")


def _continuation(limit: int = 2, max_items: int = 5) -> Continuation:
    return Continuation(StreamContinuation("write", limit, max_items, 1.0), DEPLOYMENT)


def test_a_lost_replica_continues_the_stream_with_its_items_ahead_of_every_class() -> None:
    continuation = _continuation()
    for item in ("a", "b"):
        continuation.keep(item)
    call = MethodCall("r1", "write", ("request",), share=Share("alice", 2.0, 5))
    after = continuation.after(LOST, call)
    assert after is not None
    assert after.continued == ("a", "b") and after.args == ("request",)
    assert after.share == Share("alice", 2.0, CONTINUATION_CLASS)  # the key's name and weight kept
    # A stream lost before its first item is sent again as it was (no items to continue from).
    fresh = _continuation().after(ReplicaUnavailableError("gone"), MethodCall("r2", "write", ("x",)))
    assert fresh is not None and fresh.continued is None and fresh.share == Share("", 1.0, CONTINUATION_CLASS)


@pytest.mark.parametrize(
    "error",
    [
        BackPressureError("app#Model", 10),  # refused, never started: the caller's own answer
        RequestTimeoutError("slow"),  # a slow replica is never continued elsewhere
        asyncio.CancelledError(),  # the caller left
        ValueError("the method raised"),
    ],
)
def test_other_errors_end_the_stream(error: BaseException) -> None:
    continuation = _continuation()
    continuation.keep("a")
    assert continuation.after(error, MethodCall("r1", "write", ("request",))) is None


def test_the_limit_the_item_bound_and_a_continuation_no_replica_took_end_it() -> None:
    call = MethodCall("r1", "write", ("request",))
    limited = _continuation(limit=2)
    assert limited.after(LOST, call) is not None
    assert limited.after(LOST, call) is not None
    assert limited.after(LOST, call) is None
    bounded = _continuation(max_items=3)
    for item in range(4):
        bounded.keep(item)
    assert bounded.after(LOST, call) is None
    waited = _continuation()
    waited.taken("ended")
    assert waited.after(LOST, call) is None


class _Writer:
    @tk.continuable(lambda request, produced: f"{request}+{len(produced)}", limit=4, wait_s=9.0)
    async def write(self, request: str) -> AsyncIterator[str]:
        yield request

    async def plain(self, request: str) -> AsyncIterator[str]:
        yield request


def test_the_decorator_marks_generator_methods_and_the_build_reads_them() -> None:
    assert continuations_of(_Writer) == (StreamContinuation("write", 4, 65_536, 9.0),)
    continue_from = continue_from_of(_Writer().write)  # read through the bound method
    assert continue_from is not None and continue_from("req", ["a", "b"]) == "req+2"
    assert continue_from_of(_Writer().plain) is None
    assert continuations_of(lambda: None) == ()


def _continue(request: object, produced: Sequence[object]) -> object:
    return request


def test_the_decorator_refuses_what_cannot_be_continued() -> None:
    with pytest.raises(DefinitionError, match="generator"):

        class _NotAStream:
            @tk.continuable(_continue)
            async def answer(self, request: str) -> str:
                return request

    with pytest.raises(DefinitionError, match="at least 1"):
        tk.continuable(_continue, limit=0)
    with pytest.raises(DefinitionError, match="function"):
        tk.continuable("not a function")  # type: ignore[arg-type]
