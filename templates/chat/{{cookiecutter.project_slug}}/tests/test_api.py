"""The OpenAI-compatible API and the WebSocket, on the in-process backend."""

from __future__ import annotations

import json

import app_toolkit as tk

from .conftest import chat


def test_lists_its_model(client: tk.testing.TestClient) -> None:
    assert client.get("/v1/models").json()["data"][0]["id"] == "echo"


def test_completion(client: tk.testing.TestClient) -> None:
    body = client.post("/v1/chat/completions", json=chat("hello brave new world")).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello brave new world"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}


def test_streamed_completion_arrives_in_chunks(client: tk.testing.TestClient) -> None:
    request = chat("one two three", stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(item) for item in data[:-1]]
    pieces = [chunk["choices"][0]["delta"].get("content", "") for chunk in chunks if chunk["choices"]]
    assert "".join(pieces) == "one two three" and len([p for p in pieces if p]) == 3
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 3


def test_stop_sequences_and_max_tokens(client: tk.testing.TestClient) -> None:
    stopped = client.post("/v1/chat/completions", json=chat("a b c d", stop=["c"])).json()
    assert stopped["choices"][0]["message"]["content"] == "a b "
    cut = client.post("/v1/chat/completions", json=chat("a b c d", max_tokens=2)).json()
    assert cut["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "a b "},
        "finish_reason": "length",
    }


def test_errors_have_openai_shape(client: tk.testing.TestClient) -> None:
    unknown = client.post("/v1/chat/completions", json={**chat("hi"), "model": "gpt-17"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    malformed = client.post("/v1/chat/completions", json={"messages": []})
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
    too_long = client.post("/v1/chat/completions", json=chat("word " * 5000))
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"


def test_websocket_chat_and_stop(client: tk.testing.TestClient) -> None:
    with client.websocket_connect("/v1/chat/ws") as socket:
        socket.send_json(chat("red green blue"))
        assert socket.receive_json()["type"] == "start"
        texts = []
        while (message := socket.receive_json())["type"] == "delta":
            texts.append(message["text"])
        assert "".join(texts) == "red green blue" and message["finish_reason"] == "stop"

        socket.send_json(chat("word " * 400))  # two seconds of reply
        assert socket.receive_json()["type"] == "start"
        assert socket.receive_json()["type"] == "delta"
        socket.send_json({"type": "stop"})
        while (message := socket.receive_json())["type"] == "delta":
            pass
        assert message == {"type": "done", "finish_reason": "stopped"}

        socket.send_json({"messages": "not a list"})
        assert socket.receive_json()["error"]["type"] == "invalid_request_error"
