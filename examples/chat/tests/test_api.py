"""The OpenAI-compatible API and the WebSocket, on the in-process backend."""

from __future__ import annotations

import json

import app_toolkit as tk
import openai
import pytest

from .conftest import chat


def test_lists_its_model(client: tk.testing.TestClient) -> None:
    assert client.get("/v1/models").json()["data"][0]["id"] == "echo"


def test_completion(client: tk.testing.TestClient) -> None:
    body = client.post("/v1/chat/completions", json=chat("hello brave new world")).json()
    assert body["object"] == "chat.completion"
    # As OpenAI answers: no refusal, no log probabilities.
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "hello brave new world",
        "refusal": None,
    }
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
        "message": {"role": "assistant", "content": "a b ", "refusal": None},
        "logprobs": None,
        "finish_reason": "length",
    }


def test_errors_have_openai_shape(client: tk.testing.TestClient) -> None:
    unknown = client.post("/v1/chat/completions", json={**chat("hi"), "model": "gpt-17"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    malformed = client.post("/v1/chat/completions", json={"messages": []})
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
    assert malformed.json()["error"]["param"] == "messages"
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


def test_content_parts_and_the_developer_role(client: tk.testing.TestClient) -> None:
    parts = [{"type": "text", "text": "red green"}, {"type": "text", "text": "blue"}]
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": parts}]
    body = client.post("/v1/chat/completions", json={"model": "echo", "messages": messages}).json()
    assert body["choices"][0]["message"]["content"] == "red green blue"  # the echo model splits at spaces
    assert body["usage"]["prompt_tokens"] == 5  # the developer's words count as a system message's
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    refused = client.post("/v1/chat/completions", json=chat([parts[0], image]))
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "messages[0].content[1].type"
    assert "'image_url'" in refused.json()["error"]["message"]
    tool = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "tool", "content": "42", "tool_call_id": "x"}]}
    )
    assert tool.status_code == 400 and tool.json()["error"]["param"] == "messages[0].role"


def test_options_it_cannot_honour_are_refused_by_name(client: tk.testing.TestClient) -> None:
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    for option, value in [
        ("n", 2),
        ("logprobs", True),
        ("tools", tools),
        ("response_format", {"type": "json_object"}),
        ("seed", 7),  # only the openai backend passes it on
        ("colour", "red"),
    ]:
        answer = client.post("/v1/chat/completions", json=chat("hi", **{option: value}))
        assert answer.status_code == 400, option
        error = answer.json()["error"]
        assert error["param"] == option and error["type"] == "invalid_request_error"
        assert option in error["message"]
    unknown = client.post("/v1/chat/completions", json=chat("hi", colour="red")).json()["error"]
    assert unknown["message"] == "Unrecognized request argument supplied: colour"
    # Defaults, and options that change nothing, are accepted.
    accepted = chat(
        "hi", n=1, logprobs=False, tools=[], user="u-1", store=False, response_format={"type": "text"}
    )
    assert client.post("/v1/chat/completions", json=accepted).status_code == 200


def test_models_by_id(client: tk.testing.TestClient) -> None:
    assert client.get("/v1/models/echo").json() == {
        "id": "echo",
        "object": "model",
        "created": 0,
        "owned_by": "app_toolkit",
    }
    missing = client.get("/v1/models/gpt-17")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_responses_with_the_official_client(client: tk.testing.TestClient) -> None:
    api = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="none", http_client=client, max_retries=0)
    made = api.responses.create(model="echo", input="one two three", instructions="Be brief.")
    assert made.status == "completed" and made.output_text == "one two three"
    assert made.usage is not None and (made.usage.input_tokens, made.usage.output_tokens) == (5, 3)
    listed = api.responses.create(
        model="echo",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "first"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "first"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "second turn"}]},
        ],
        max_output_tokens=1,
    )
    assert listed.status == "incomplete" and listed.output_text == "second "
    assert listed.incomplete_details is not None and listed.incomplete_details.reason == "max_output_tokens"

    with api.responses.stream(model="echo", input="red green blue") as events:
        deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
        final = events.get_final_response()
    assert deltas == ["red ", "green ", "blue"] and final.output_text == "red green blue"
    assert final.usage is not None and final.usage.output_tokens == 3

    for request, param in [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "{}"}]}, "input[0].type"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "hi", "text": {"format": {"type": "json_object"}}}, "text.format"),  # text only here
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].id"),  # nothing is kept
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            api.responses.create(model="echo", **request)  # type: ignore[call-overload]
        assert refused.value.param == param


def test_cors_is_off_by_default(client: tk.testing.TestClient) -> None:
    preflight = {"Origin": "https://chat.example.com", "Access-Control-Request-Method": "POST"}
    assert client.options("/v1/chat/completions", headers=preflight).status_code == 405
    answer = client.post(
        "/v1/chat/completions", json=chat("hi"), headers={"Origin": "https://chat.example.com"}
    )
    assert "access-control-allow-origin" not in answer.headers


def test_a_long_input_and_many_items(client: tk.testing.TestClient) -> None:
    long = client.post(
        "/v1/responses", json={"model": "echo", "input": "word " * 1000, "max_output_tokens": 2}
    )
    assert long.status_code == 200 and long.json()["usage"]["input_tokens"] == 1000
    many = client.post("/v1/responses", json={"input": [{"role": "user", "content": "hi"}] * 2_001})
    assert many.status_code == 400 and many.json()["error"]["param"].startswith("input")
