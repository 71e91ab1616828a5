"""The request's context: one scope per request, nested scopes keep what they do not
say, everything comes back on the way out, and a batch serves no one request."""

from __future__ import annotations

import asyncio

import pytest

from app_toolkit._runtime import request_context, tracing
from app_toolkit._runtime.drain_signal import DrainSignal
from app_toolkit._runtime.request_context import current_model_id, current_request_id, request_scope


def _serving() -> request_context.Serving:
    replica = request_context.ReplicaContext("app", "Model", "app.Model.ab12")
    return request_context.Serving(replica, object(), None, DrainSignal(), [])


def test_an_inner_scope_keeps_the_span_and_model_it_does_not_name() -> None:
    outer_trace = tracing.new_trace()
    with request_scope("outer", outer_trace, _serving(), "m1"):
        with request_scope("log-records"):  # as the front names a request for its logs
            assert current_request_id() == "log-records"
            assert tracing.current_trace() is outer_trace
            assert current_model_id() == "m1"
        with request_scope("inner", None, _serving(), ""):  # a replica's scope names its model
            assert current_model_id() == ""
            assert tracing.current_trace() is outer_trace
        assert (current_request_id(), current_model_id()) == ("outer", "m1")
        assert tracing.current_trace() is outer_trace
    assert (current_request_id(), current_model_id(), tracing.current_trace()) == ("", "", None)
    assert request_context.replica.get() is None


def test_a_lazy_span_is_made_once_when_read() -> None:
    parent = tracing.new_trace()
    with request_scope("r1", tracing.LazyTrace(parent), _serving()):
        seen = tracing.current_trace()
        assert seen is not None and seen.trace_id == parent.trace_id and seen.parent_id == parent.span_id
        assert tracing.current_trace() is seen


@pytest.mark.anyio
async def test_a_batch_serves_no_one_request_and_its_model_stays_in_its_task() -> None:
    seen: list[tuple[str, str, object]] = []

    async def batch() -> None:
        request_context.serve_batch("m2")
        seen.append((current_request_id(), current_model_id(), tracing.current_trace()))

    with request_scope("started-the-batcher", tracing.new_trace(), _serving(), "m1"):
        await asyncio.get_running_loop().create_task(batch())  # a copy of this context
        assert (current_request_id(), current_model_id()) == ("started-the-batcher", "m1")
    assert seen == [("", "m2", None)]
