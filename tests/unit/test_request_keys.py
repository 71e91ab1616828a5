"""The keys that choose a replica, as the proxy and the replica read them from headers and
a handle sends them: the multiplexed model's two header forms, the session's, and which
one wins when a request sends more than one."""

from __future__ import annotations

import pickle

import pytest

import app_toolkit as tk
from app_toolkit._runtime import request_context
from app_toolkit._runtime.drain_signal import DrainSignal
from app_toolkit._runtime.front.scope import read_headers
from app_toolkit._runtime.request_keys import model_id_in, routing_key
from app_toolkit.deployment_id import DeploymentID
from app_toolkit.replica_id import ReplicaID

Headers = list[tuple[bytes, bytes]]


@pytest.mark.parametrize(
    ("headers", "model"),
    [
        ([(b"serve_multiplexed_model_id", b"m1")], "m1"),
        ([(b"serve-multiplexed-model-id", b"m2")], "m2"),  # what nginx lets through
        # Both forms are one header: the last line counts, as in Ray Serve's proxy.
        ([(b"serve-multiplexed-model-id", b"m2"), (b"serve_multiplexed_model_id", b"m1")], "m1"),
        ([(b"serve_multiplexed_model_id", b"m1"), (b"serve-multiplexed-model-id", b"m2")], "m2"),
        ([(b"serve_multiplexed_model_id", b"m1"), (b"serve_multiplexed_model_id", b"m4")], "m4"),
        (
            [(b"serve_multiplexed_model_id", b""), (b"serve-multiplexed-model-id", b"m2")],
            "m2",
        ),  # empty: unsent
        ([(b"x-other", b"m3")], ""),
    ],
)
def test_the_proxy_and_the_replica_read_one_model_from_either_header_form(
    headers: Headers, model: str
) -> None:
    assert read_headers({"headers": headers}).model_id == model
    assert model_id_in(headers) == model
    serving = request_context.Serving(
        request_context.ReplicaContext(
            "app", "Model", ReplicaID("app.Model.ab12", DeploymentID("app", "Model"))
        ),
        None,
        None,
        DrainSignal(),
        [],
    )
    # The replica reads the scope's headers only if asked.
    with request_context.request_scope("r1", None, serving, headers):
        assert tk.get_multiplexed_model_id() == model


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ([(b"x-session-id", b"s1")], "s1"),
        ([(b"x_session_id", b"s2")], "s2"),
        ([(b"x_session_id", b"s2"), (b"x-session-id", b"s1")], "s1"),  # the last line counts
        ([(b"x-session-id", b"s1"), (b"x_session_id", b"s2")], "s2"),
        # A shard key and a session: the shard key picks the replica, in either order.
        ([(b"x-session-id", b"s1"), (b"x-serve-shard-key", b"k1")], "k1"),
        ([(b"x-serve-shard-key", b"k1"), (b"x_session_id", b"s2")], "k1"),
        ([(b"x-serve-shard-key", b""), (b"x-session-id", b"s1")], "s1"),
        ([], ""),
    ],
)
def test_a_session_id_routes_like_a_shard_key_and_a_shard_key_wins(headers: Headers, key: str) -> None:
    read = read_headers({"headers": headers})
    assert read.shard_key == key
    assert read.model_id == ""


def test_a_configured_shard_key_header_may_be_the_session_header() -> None:
    read = read_headers({"headers": [(b"x-session-id", b"s1")]}, shard_header=b"x-session-id")
    assert read.shard_key == "s1"


def test_a_handle_keeps_its_session_through_options_and_pickling_and_its_shard_key_wins() -> None:
    handle = tk.DeploymentHandle("d", "app").options(session_id="s1")
    assert handle.session_id == "s1"
    copied = pickle.loads(pickle.dumps(handle.options(method_name="m", shard_key="k1")))
    assert (copied.session_id, copied.shard_key, copied.method_name) == ("s1", "k1", "m")
    assert routing_key(handle.shard_key, handle.session_id) == "s1"
    assert routing_key(copied.shard_key, copied.session_id) == "k1"
    assert handle.options(session_id="").session_id == ""
