"""Ray Serve parity, part 3: what Ray Serve's own tests expect of a program written for it
(the programs: tests/apps/serve_parity.py), on both backends."""

from __future__ import annotations

import asyncio
import gc
import pickle
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

import app_toolkit as serve
from app_toolkit._runtime.backends.base import current_session
from app_toolkit.build import build_app
from tests.apps import serve_parity as apps
from tests.apps import serve_parity_handles as handle_apps
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for, wait_for_async


def test_functions_and_call_methods_without_parameters_get_no_request(toolkit: Toolkit) -> None:
    toolkit.run(apps.no_params.bind(), route_prefix="/p-fn")
    toolkit.run(as_deployment(apps.NoParamsCall).bind(), route_prefix="/p-call")
    with toolkit.client() as client:
        assert client.get("/p-fn").text == "called without the request"
        assert client.get("/p-call").text == "__call__ without the request"


def test_each_yield_reaches_the_client_as_its_own_chunk(toolkit: Toolkit) -> None:
    streamer = as_deployment(apps.Streamer).bind()
    toolkit.run(streamer, route_prefix="/p-stream")
    toolkit.run(as_deployment(apps.ReStreamer).bind(streamer), route_prefix="/p-restream")
    with toolkit.client() as client:
        with client.stream("GET", "/p-stream") as response:
            assert list(response.iter_raw()) == [f"hi_{n}".encode() for n in range(10)]
        with client.stream("GET", "/p-restream/") as response:  # through a streaming handle
            assert list(response.iter_raw()) == [f"hi_{n}".encode() for n in range(5)]


def test_a_stream_that_fails_midway_is_cut_off_not_completed(toolkit: Toolkit) -> None:
    toolkit.run(as_deployment(apps.Streamer).bind(), route_prefix="/p-broken")
    received: list[bytes] = []
    with toolkit.client() as client, pytest.raises(httpx.RemoteProtocolError):
        with client.stream("GET", "/p-broken", params={"fail_at": 3}) as response:
            assert response.status_code == 200
            received.extend(response.iter_raw())
    assert b"".join(received).startswith(b"hi_0")
    with toolkit.client() as client:  # the connection pool and the proxy carry on
        assert client.get("/p-broken").status_code == 200


def test_async_init_is_awaited_and_one_class_bound_twice_gets_a_second_name(toolkit: Toolkit) -> None:
    handle = toolkit.run(as_deployment(apps.AsyncInit).bind("hello from async init"), route_prefix=None)
    assert handle.remote().result(timeout_s=30) == "hello from async init"
    name = toolkit.name()
    downstream = as_deployment(apps.Downstream)
    upstream = as_deployment(apps.Upstream).bind(downstream.bind("first"), downstream.bind("second"))
    handle = toolkit.run(upstream, name=name, route_prefix=None)
    assert handle.remote().result(timeout_s=30) == "first second"
    assert set(serve.status().applications[name].deployments) == {"Upstream", "Downstream", "Downstream_1"}


def test_a_bound_deployment_inside_a_user_object_becomes_a_handle(toolkit: Toolkit) -> None:
    class LocalHolder:  # defined in a function: plain pickle cannot copy it, cloudpickle can
        def __init__(self, inner: object) -> None:
            self.inner = inner

    downstream = as_deployment(apps.Downstream)
    app = as_deployment(apps.UsesHolder).bind(
        apps.Holder(downstream.bind("inside")), LocalHolder(downstream.bind("local"))
    )
    assert toolkit.run(app, route_prefix=None).remote().result(timeout_s=30) == "inside local"


def test_ingress_builders_and_one_app_shared_by_two_classes(toolkit: Toolkit) -> None:
    toolkit.run(apps.BuiltIngress.bind("an argument for the class, not the builder"), route_prefix="/p-built")
    toolkit.run(as_deployment(apps.SharedOne).bind(), route_prefix="/p-one")
    toolkit.run(as_deployment(apps.SharedTwo).bind(), route_prefix="/p-two")
    with toolkit.client() as client:
        assert client.get("/p-built/built").json() == "built on the replica"
        assert client.get("/p-one/one").json() == "one"
        assert client.get("/p-one/two").status_code == 404  # the other class's route
        assert client.get("/p-two/two").json() == "two"
        assert client.get("/p-two/one").status_code == 404


def test_teardown_hooks_run_on_delete_and_on_redeploy(toolkit: Toolkit, tmp_path: Path) -> None:
    folder = str(tmp_path)
    name = toolkit.name()
    toolkit.run(as_deployment(apps.Finalized).bind(folder), name=name, route_prefix=None)
    serve.delete(name)
    wait_for(lambda: (tmp_path / "del-1").exists(), 30, "__del__ of the deleted replica's object")

    name = toolkit.name()
    toolkit.run(as_deployment(apps.AsyncFinalized).bind(folder), name=name, route_prefix=None)
    serve.delete(name)
    marks = tmp_path / "async-del"
    wait_for(marks.exists, 30, "the awaited async __del__ of the deleted replica's object")
    time.sleep(0.5)  # its object is collected meanwhile: that must not run it again
    gc.collect()
    assert marks.read_text() == "ran\n"

    name = toolkit.name()
    toolkit.run(apps.make_lifespan_app(folder, 1), name=name, route_prefix="/p-life")
    toolkit.run(apps.make_lifespan_app(folder, 2), name=name, route_prefix="/p-life")  # redeploy
    wait_for(lambda: (tmp_path / "lifespan-1").exists(), 30, "lifespan shutdown of the replaced replica")
    serve.delete(name)
    wait_for(lambda: (tmp_path / "lifespan-2").exists(), 30, "lifespan shutdown on delete")

    name = toolkit.name()
    models = as_deployment(apps.Models)
    recorder = as_deployment(apps.Recorder).bind(folder)
    handle = toolkit.run(models.bind(folder, 1, recorder), name=name, route_prefix=None)
    for model in ("a", "recorded-b"):  # a plain __del__; an aclose() that calls the Recorder
        assert handle.options(multiplexed_model_id=model).remote().result(timeout_s=30) == f"model-{model}-v1"
    # An upgrade replaces the replica, and its models are released. The new version has no
    # Recorder: it is deleted, but only once the replica whose release calls it is gone
    # (the call succeeds under Ray Serve; here the Recorder was deleted at once, and the
    # call failed).
    toolkit.run(models.bind(folder, 2), name=name, route_prefix=None)
    wait_for(lambda: (tmp_path / "model-a-v1").exists(), 30, "the old replica's model released")
    recorded = tmp_path / "recorded-model-recorded-b-v1"
    wait_for(recorded.exists, 30, "the release's call to the Recorder")


def test_backpressure_config_sets_the_overload_answer(toolkit: Toolkit, tmp_path: Path) -> None:
    handle = toolkit.run(as_deployment(handle_apps.Busy).bind(str(tmp_path)), route_prefix="/p-busy")

    async def burst() -> list[httpx.Response]:
        async with toolkit.async_client() as client:
            first = asyncio.ensure_future(client.get("/p-busy"))
            try:
                await wait_for_async((tmp_path / "busy").exists, 20, "the first request to run", 0.02)
                # One of these takes the only queue place, the other is refused at once,
                # while the first still holds the slot.
                others = [asyncio.ensure_future(client.get("/p-busy")) for _ in range(2)]
                await asyncio.wait(others, timeout=20, return_when=asyncio.FIRST_COMPLETED)
            finally:
                handle_apps.open_gate(str(tmp_path))
            return [await first, *[await other for other in others]]

    responses = asyncio.run(burst())
    assert sorted(r.status_code for r in responses) == [200, 200, 429]
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["retry-after"] == "1" and refused.headers["x-request-id"]
    # A new caller's first burst (this handle has not been used: it has no routing table
    # yet) is held to the same bound: one runs, one queues, the newest two are refused.
    (tmp_path / "open").unlink()
    try:
        calls = [handle.remote() for _ in range(4)]
        for call in calls[2:]:
            with pytest.raises(serve.BackPressureError):
                call.result(timeout_s=10)
    finally:
        handle_apps.open_gate(str(tmp_path))
    assert [call.result(timeout_s=30) for call in calls[:2]] == ["done", "done"]  # ran, then the queued one


def test_decorator_forms_and_their_errors(toolkit: Toolkit) -> None:
    assert as_deployment(handle_apps.NamedFirst).name == "named_first"
    toolkit.run(as_deployment(handle_apps.BareBatch).bind(), route_prefix="/p-bare")
    with toolkit.client() as client:
        assert client.get("/p-bare", params={"x": 21}).json() == 42
    with pytest.raises(TypeError):

        @serve.multiplexed  # type: ignore[arg-type]  # a class, on purpose
        class NotAFunction:
            pass

    with pytest.raises(TypeError, match="async"):

        @serve.batch  # type: ignore[arg-type]  # not async, on purpose
        def not_async(items: list[int]) -> list[int]:
            return items

    # Options are checked when the decorator runs, with Ray Serve's error types: a wrong
    # type is a TypeError, a value out of range a ValueError.
    with pytest.raises(TypeError, match="max_batch_size"):
        serve.batch(max_batch_size=1.5)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="max_batch_size"):
        serve.batch(max_batch_size=0)
    with pytest.raises(ValueError, match="batch_wait_timeout_s"):
        serve.batch(batch_wait_timeout_s=-1)
    with pytest.raises(TypeError, match="max_concurrent_batches"):
        serve.batch(max_concurrent_batches=0)
    serve.batch(max_batch_size=2.0)  # type: ignore[call-overload]  # a whole float, as Ray Serve takes it
    with pytest.raises(TypeError, match="max_num_models_per_replica"):
        serve.multiplexed(max_num_models_per_replica=1.5)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="max_num_models_per_replica"):
        serve.multiplexed(max_num_models_per_replica=0)
    serve.multiplexed(max_num_models_per_replica=-1)  # no limit, as in Ray Serve


def test_batches_hold_one_multiplexed_model_each(toolkit: Toolkit) -> None:
    handle = toolkit.run(as_deployment(handle_apps.BatchedModels).bind(), route_prefix=None)
    calls = [handle.options(multiplexed_model_id=model).remote() for model in ("a", "b") * 6]
    for call in calls:
        batch_model, models, _ = call.result(timeout_s=30).split(":")
        assert models == batch_model  # each batch saw one model, and that was its id


def test_a_reconfigure_that_declares_rank_gets_the_replicas_rank_at_start(toolkit: Toolkit) -> None:
    """Two replicas: each reconfigure(None, rank=...) ran once, at start, with its own rank
    (the one get_replica_context() gives), on one node."""
    handle = toolkit.run(as_deployment(handle_apps.Ranked).bind(), route_prefix=None)
    seen = handle.broadcast("calls_seen").results(timeout_s=30)
    assert all(len(calls) == 1 for calls in seen), seen
    calls = [tuple(replica[0]) for replica in seen]
    assert sorted((config, rank, node_rank, same) for config, rank, node_rank, _, same in calls) == [
        (None, 0, 0, True),
        (None, 1, 0, True),
    ]
    assert sorted(local_rank for *_, local_rank, _ in calls) == [0, 1]  # in the order they were placed


def test_get_replica_context_has_ray_serves_fields(toolkit: Toolkit) -> None:
    """Ray Serve 2.60's ReplicaContext: replica_id a ReplicaID (still the id string here),
    replica_tag, servable_object (None in the constructor), code_version, gang_context."""
    name = toolkit.name()
    handle = toolkit.run(as_deployment(handle_apps.ContextFields).bind(), name=name, route_prefix=None)
    fields = handle.fields.remote().result(timeout_s=30)
    replica = serve.status().applications[name].deployments["ContextFields"].replicas[0]
    assert fields["id"] == replica.replica_id == f"{name}.ContextFields.{fields['unique_id']}"
    assert fields["replica_tag"] == fields["unique_id"]
    assert fields["deployment"] == (name, "ContextFields")
    assert fields["full_id"] == f"SERVE_REPLICA::{name}#ContextFields#{fields['unique_id']}"
    assert (fields["is_me"], fields["in_constructor"], fields["gang_context"]) == (True, None, None)
    assert fields["code_version"] == replica.code_version


def test_a_call_lost_with_its_replica_is_a_ray_actor_error_on_ray(toolkit: Toolkit, tmp_path: Path) -> None:
    """Stopped past graceful_shutdown_timeout_s while it runs a call and a stream:
    RequestLostError for both, which on Ray is also Ray's RayActorError (what Ray Serve
    code catches), and keeps its type and message through pickling."""
    name = toolkit.name()
    handle = toolkit.run(as_deployment(handle_apps.Hangs).bind(str(tmp_path)), name=name, route_prefix=None)
    call = handle.remote()
    stream = handle.options(stream=True).items.remote()
    assert next(stream) == "first"
    wait_for(lambda: (tmp_path / "hangs").exists() and (tmp_path / "streams").exists(), 30, "both to run")
    serve.delete(name, _blocking=False)
    with pytest.raises(serve.RequestLostError) as raised:
        call.result(timeout_s=30)
    with pytest.raises(serve.RequestLostError) as stream_raised:
        next(stream)
    lost = raised.value
    if toolkit.backend == "ray":
        import ray.exceptions

        assert isinstance(lost, ray.exceptions.RayActorError)
        assert isinstance(stream_raised.value, ray.exceptions.RayActorError)
    copy = pickle.loads(pickle.dumps(lost))
    assert (type(copy), str(copy), copy.args) == (type(lost), str(lost), lost.args)
    assert "was lost while it had the request" in str(copy)


def test_handle_errors_say_what_ray_serve_says(toolkit: Toolkit) -> None:
    methods = toolkit.run(as_deployment(handle_apps.Methods).bind(), route_prefix=None)
    with pytest.raises(serve.RayServeException, match=r"Tried to call a method 'nope' that does not exist"):
        methods.nope.remote().result(timeout_s=30)
    with pytest.raises(AttributeError) as raised:  # and an AttributeError, as before
        methods.nope.remote().result(timeout_s=30)
    assert "Available methods: " in str(raised.value) and "'known'" in str(raised.value)
    with pytest.raises(RuntimeError, match="Sync methods should not be called from within an `asyncio`"):
        methods.blocks.remote(methods).result(timeout_s=30)


def test_errors_and_status_in_ray_serves_shape(toolkit: Toolkit) -> None:
    with pytest.raises(serve.RayServeException, match="Application 'no-such-app' does not exist."):
        serve.get_app_handle("no-such-app")
    with pytest.raises(
        ValueError, match=r"Invalid route_prefix 'no_slash', must start with a forward slash \('/'\)"
    ):
        serve.run(apps.no_params.bind(), route_prefix="no_slash")
    failing = FastAPI()

    @failing.get("/")
    def fails() -> None:
        raise ValueError("secret detail")

    toolkit.run(serve.deployment(serve.ingress(failing)()).bind(), route_prefix="/p-500")
    with toolkit.client() as client:
        response = client.get("/p-500/")
    assert (response.status_code, response.text) == (500, "Internal Server Error")
    assert response.headers["x-request-id"]
    # No __call__ to serve HTTP with: failing around the app is answered as the app's own.
    toolkit.run(as_deployment(handle_apps.Methods).bind(), name=toolkit.name(), route_prefix="/p-no-call")
    with toolkit.client() as client:
        response = client.get("/p-no-call")
    assert (response.status_code, response.text) == (500, "Internal Server Error")
    assert response.headers["x-request-id"]
    if toolkit.backend == "ray":
        assert set(serve.status().proxies.values()) == {serve.ProxyStatus.HEALTHY}


def test_overload_of_a_downstream_call_the_app_does_not_catch_is_overload(
    toolkit: Toolkit, tmp_path: Path
) -> None:
    narrow = as_deployment(handle_apps.Narrow).bind(str(tmp_path))
    toolkit.run(as_deployment(handle_apps.CallsNarrow).bind(narrow), route_prefix="/p-down")

    async def burst() -> list[httpx.Response]:
        async with toolkit.async_client() as client:
            assert (await client.get("/p-down", params={"warm": 1})).text == "pong"
            first = asyncio.ensure_future(client.get("/p-down"))
            await wait_for_async((tmp_path / "narrow").exists, 20, "the first request to run", 0.02)
            # One of these waits in the caller's queue, the other is refused there.
            second, third = await asyncio.gather(client.get("/p-down"), client.get("/p-down"))
            return [await first, second, third]

    responses = asyncio.run(burst())
    assert sorted(r.status_code for r in responses) == [200, 200, 503]  # Ray Serve: 503, not 500
    refused = next(r for r in responses if r.status_code == 503)
    assert (
        refused.headers["retry-after"] == "1"
        and refused.json()["request_id"] == refused.headers["x-request-id"]
    )


def test_a_response_nested_in_an_argument_is_refused_as_ray_serve_refuses_it(toolkit: Toolkit) -> None:
    handle = toolkit.run(
        as_deployment(handle_apps.PassesNested).bind(as_deployment(handle_apps.Echo).bind()),
        route_prefix=None,
    )
    assert handle.top_level.remote().result(timeout_s=30) == 1  # a top-level one is awaited for it
    with pytest.raises(serve.RayServeException, match="`DeploymentResponse` is not serializable"):
        handle.remote().result(timeout_s=30)


def test_handles_to_other_apps_inside_replicas(toolkit: Toolkit) -> None:
    other = toolkit.name()
    toolkit.run(as_deployment(apps.Downstream).bind("other app"), name=other, route_prefix=None)
    handle = toolkit.run(as_deployment(handle_apps.CrossApp).bind(other), route_prefix=None)
    assert handle.remote().result(timeout_s=30) == "other app|other app"


def test_run_many_deploys_several_applications_in_one_call(toolkit: Toolkit) -> None:
    first, second = toolkit.name(), toolkit.name()
    downstream = as_deployment(apps.Downstream)
    handles = toolkit.run_many(
        [
            serve.RunTarget(downstream.bind("first"), name=first, route_prefix="/p-many"),
            serve.RunTarget(apps.no_params.bind(), name=second, route_prefix=None),
        ]
    )
    assert [handle.remote().result(timeout_s=30) for handle in handles] == [
        "first",
        "called without the request",
    ]
    with toolkit.client() as client:
        assert client.get("/p-many").text == "first"
    assert {first, second} <= set(serve.status().applications)
    # Checked and built before anything is deployed: a clash between the targets, a name
    # given twice or a target whose build fails deploys none of them.
    third, fourth = toolkit.name(), toolkit.name()
    with pytest.raises(serve.ConfigError, match="already used by application"):
        toolkit.run_many(
            [
                serve.RunTarget(downstream.bind("x"), name=third, route_prefix="/p-clash"),
                serve.RunTarget(downstream.bind("y"), name=fourth, route_prefix="/p-clash"),
            ]
        )
    fifth = toolkit.name()
    with pytest.raises(
        serve.ConfigError, match=rf"run_many\(\) got application name\(s\) '{fifth}' more than once"
    ):
        toolkit.run_many(
            [serve.RunTarget(downstream.bind(word), name=fifth, route_prefix=None) for word in "xy"]
        )
    sixth, seventh = toolkit.name(), toolkit.name()
    with pytest.raises(serve.ConfigError, match="autoscaling_policy.policy_function"):
        toolkit.run_many(
            [
                serve.RunTarget(downstream.bind("x"), name=sixth, route_prefix=None),
                serve.RunTarget(
                    downstream.bind("y"),
                    name=seventh,
                    route_prefix=None,
                    autoscaling_policy="tests.no_such:policy",
                ),
            ]
        )
    assert not {third, fourth, fifth, sixth, seventh} & set(serve.status().applications)
    with pytest.raises(
        serve.ConfigError, match=r"run_many\(\) takes RunTarget\(app, \.\.\.\) items whose app is"
    ):
        serve.run_many([serve.RunTarget(downstream, name=toolkit.name())])  # type: ignore[arg-type]  # not bound
    with pytest.raises(serve.ConfigError, match=r"^run\(\) takes an application such as"):
        serve.run(downstream)  # type: ignore[arg-type]  # not bound


def test_local_testing_mode_serves_handles_only(no_backend: None) -> None:
    handle = serve.run(as_deployment(apps.Downstream).bind("local"), _local_testing_mode=True)
    try:
        assert handle.remote().result(timeout_s=30) == "local"
        session = current_session(create=False)
        assert session is not None and session.backend_name == "local"
        assert session.link.backend.server is None  # type: ignore[attr-defined] # no socket was opened
    finally:
        serve.shutdown()


def test_names_of_a_graph_are_unique_in_build_order() -> None:
    downstream = as_deployment(apps.Downstream)
    spec = build_app(
        as_deployment(apps.Upstream).bind(downstream.bind("a"), downstream.bind("b")),
        "g",
        None,
        lambda value: b"x",
    )
    assert [d.id.name for d in spec.deployments] == ["Downstream", "Downstream_1", "Upstream"]
