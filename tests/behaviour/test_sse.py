"""EventStream and ChatCompletionStream through the proxy, on both backends."""

from __future__ import annotations

import threading
import time

import openai
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import app_toolkit as tk
from tests.apps import streams
from tests.conftest import Toolkit
from tests.draining import StreamReader


def test_event_stream_headers_ids_and_heartbeats(toolkit: Toolkit) -> None:
    toolkit.run(streams.make_app(), route_prefix="/sse")
    with toolkit.client() as client:
        with client.stream("GET", "/sse/events", params={"count": 3}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["cache-control"] == "no-cache"
            assert response.headers["x-accel-buffering"] == "no"
            lines = [line for line in response.iter_lines() if line]
        assert lines == [
            "id: 1",
            "data: plain 0",
            "id: 2",
            "event: tick",
            "data: tick 1",
            "id: 3",
            "data: plain 2",
        ]
        params = {"count": 2, "delay": 0.6, "ping": 0.2}
        with client.stream("GET", "/sse/events", params=params) as response:
            lines = [line for line in response.iter_lines() if line]
        assert any(line.startswith(": ping") for line in lines)  # comment heartbeats


#: The grace period of the drain tests' replicas (graceful_shutdown_timeout_s).
GRACE_S = 3.0


def test_at_a_drain_streams_run_to_its_deadline_and_feeds_marked_so_end_at_once(toolkit: Toolkit) -> None:
    """About 4 s on Ray: the replica's 3 s grace period runs out while the test reads."""
    name = toolkit.name()
    toolkit.run(streams.make_app(graceful_shutdown_timeout_s=GRACE_S), name=name, route_prefix="/drain-sse")
    endless, prices = StreamReader(toolkit, "/drain-sse/endless"), StreamReader(toolkit, "/drain-sse/prices")
    endless.wait_started()
    prices.wait_started()
    began = time.monotonic()
    deleting = threading.Thread(target=tk.delete, args=(name,))
    deleting.start()  # the replica drains
    prices.join()
    endless.join()
    deleting.join(timeout=30)
    assert not deleting.is_alive()
    assert prices.ended_at is not None and endless.ended_at is not None
    # The feed marked end_at_drain ended with the drain event when the drain began: before
    # its deadline, which it did not wait for.
    assert prices.text()[-3:] == ["event: drain", "data: server is shutting down; reconnect", "retry: 1000"]
    assert prices.ended_at - began < GRACE_S - 1
    # The other stream ran on, events and all, and ended with the drain event at the
    # deadline: not before (the drain began after `began`; 0.1 s for the clocks' rounding).
    assert endless.text()[-3:] == prices.text()[-3:]
    assert endless.ended_at - began >= GRACE_S - 0.1
    assert endless.data_after(prices.ended_at + 1) > 5


def test_a_reload_ends_the_replaced_replicas_streams_and_websockets_at_once(toolkit: Toolkit) -> None:
    """A redeploy by ``app-toolkit run --reload`` (``run(..., _reload=True)``) drains the
    replicas it replaces in a hurry: an open stream and a WebSocket end as a drain's
    deadline ends them, at once, though the replica's grace period is 30 s."""
    name = toolkit.name()
    toolkit.run(streams.make_app(graceful_shutdown_timeout_s=30), name=name, route_prefix="/hurry")
    events = StreamReader(toolkit, "/hurry/endless")
    events.wait_started()
    with connect(toolkit.url.replace("http://", "ws://") + "/hurry/ws") as socket:
        socket.send("hi")
        assert socket.recv(timeout=10) == "echo:hi"
        began = time.monotonic()
        changed = streams.make_app(graceful_shutdown_timeout_s=30, max_replicas_per_node=5)  # a new version
        draining = threading.Thread(
            target=toolkit.run,
            args=(changed,),
            kwargs={"name": name, "route_prefix": "/hurry", "_reload": True},
        )
        draining.start()
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=25)  # below the 30 s grace: waiting it out fails here
        closed_after = time.monotonic() - began
        events.join()
    draining.join(timeout=30)
    assert not draining.is_alive()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    assert events.text()[-3] == "event: drain"
    # Below the 30 s grace period: the streams did not wait for its deadline. The new
    # version's replica starts first: 2-5 s, 11 s once on a loaded 2-core host; hence 20.
    assert events.ended_at is not None and events.ended_at - began < 20 and closed_after < 20


def test_chat_stream_is_read_by_the_official_openai_client(toolkit: Toolkit) -> None:
    toolkit.run(streams.make_app(), route_prefix="/llm")
    client = openai.OpenAI(base_url=toolkit.url + "/llm/v1", api_key="not-needed", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="toy",
            messages=[{"role": "user", "content": "hello streaming world"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "HELLO STREAMING WORLD "
    assert chunks[0].choices[0].delta.role == "assistant"
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishing == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert all(c.model == "toy" and c.object == "chat.completion.chunk" for c in chunks)

    failing = client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "one two explode"}], stream=True
    )
    received = []
    with pytest.raises(openai.APIError, match="Internal Server Error"):
        for chunk in failing:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "ONE TWO "
    client.close()
