"""EventStream and ChatCompletionStream through the proxy, on both backends."""

from __future__ import annotations

import threading

import openai
import pytest

import app_toolkit as tk
from tests.apps import streams
from tests.conftest import Toolkit


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


def test_open_streams_get_a_final_event_when_the_replica_drains(toolkit: Toolkit) -> None:
    name = toolkit.name()
    toolkit.run(streams.make_app(), name=name, route_prefix="/drain-sse")
    with toolkit.client() as client, client.stream("GET", "/drain-sse/endless") as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:")) == 'data: {"n": 0}'
        deleting = threading.Thread(target=tk.delete, args=(name,))
        deleting.start()
        rest = [line for line in lines if line]  # ends instead of hanging
        deleting.join(timeout=30)
    assert "event: drain" in rest
    assert not deleting.is_alive()


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
