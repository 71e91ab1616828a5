"""The request's context: one scope per request, nested scopes keep what they do not
say, everything comes back on the way out, and a batch serves no one request."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from app_toolkit._runtime import request_context, tracing
from app_toolkit._runtime.drain_signal import DrainSignal
from app_toolkit._runtime.request_context import current_model_id, current_request_id, request_scope
from app_toolkit.context import ReplicaContext, ReplicaID
from app_toolkit.deployment_id import DeploymentID


def _serving() -> request_context.Serving:
    replica = ReplicaContext("app", "Model", ReplicaID("app.Model.ab12", DeploymentID("app", "Model")))
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


def test_the_replica_context_has_ray_serves_fields_and_its_id_is_still_the_string() -> None:
    # Ray Serve 2.60's ReplicaContext: replica_id a ReplicaID (unique_id, deployment_id),
    # replica_tag, servable_object, code_version, gang_context. The toolkit's users read
    # replica_id as the id string, as before.
    replica_id = ReplicaID("shop.Model.3f2a9c", DeploymentID("shop", "Model"))
    context = ReplicaContext("shop", "Model", replica_id, code_version="8c1d", servable_object=len)
    assert isinstance(context.replica_id, str) and context.replica_id == "shop.Model.3f2a9c"
    assert (f"{replica_id}", hash(replica_id)) == ("shop.Model.3f2a9c", hash("shop.Model.3f2a9c"))
    assert replica_id.unique_id == context.replica_tag == "3f2a9c"
    assert (replica_id.deployment_id.app_name, replica_id.deployment_id.name) == ("shop", "Model")
    assert replica_id.to_full_id_str() == "SERVE_REPLICA::shop#Model#3f2a9c"
    assert (context.servable_object, context.code_version, context.gang_context) == (len, "8c1d", None)
    copy = pickle.loads(pickle.dumps(replica_id))
    assert (copy, copy.unique_id, copy.deployment_id) == (replica_id, "3f2a9c", DeploymentID("shop", "Model"))
    # A plain string is made a ReplicaID; an id of another shape is unique as it is.
    other = ReplicaContext("shop", "Model", "r1").replica_id  # type: ignore[arg-type]  # what callers wrote before
    assert isinstance(other, ReplicaID) and (other, other.unique_id) == ("r1", "r1")
    assert ReplicaContext("shop", "Model", replica_id).servable_object is None
