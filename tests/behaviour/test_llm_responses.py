"""app_toolkit.llm's ``/v1/responses`` on both backends, with the echo engine (no model):
the official openai client creates, streams, retrieves, continues and deletes responses;
``store: false`` keeps nothing; a dropped stream resumes from its last ``sequence_number``
while the reply goes on without any reader."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from app_toolkit.llm import build_openai_app
from tests.conftest import Toolkit

ECHO = "org/echo-1"
PREFIX = "/llm"
#: The drain test's own app, beside the module's shared one.
DRAINED = "/llm-drained"


@pytest.fixture(scope="module")
def served(module_toolkit: Toolkit) -> Iterator[openai.OpenAI]:
    """One echo model (it repeats the last user message at 1000 tokens/s, a byte a token)."""
    args = {"llm_configs": [{"model_loading_config": {"model_id": ECHO}, "llm_engine": "echo"}]}
    module_toolkit.run(build_openai_app(args), route_prefix=PREFIX)
    with openai.OpenAI(
        base_url=module_toolkit.url + PREFIX + "/v1", api_key="none", max_retries=0, timeout=30
    ) as client:
        yield client


def _events(lines: Iterator[str], count: int | None = None) -> list[dict[str, Any]]:
    """The next ``count`` events of a Responses stream's lines (all: None), each checked to
    be named by its ``type``."""
    events: list[dict[str, Any]] = []
    name = ""
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            event = json.loads(line[len("data: ") :])
            assert event["type"] == name, event
            events.append(event)
            if count is not None and len(events) == count:
                break
    return events


def test_a_response_whole_and_streamed(served: openai.OpenAI) -> None:
    said = "Hello there, café ☕ world"
    whole = served.responses.create(model=ECHO, input=said, instructions="Repeat.")
    assert (whole.status, whole.output_text, whole.object) == ("completed", said, "response")
    assert whole.usage is not None
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (len(said.encode()),) * 2
    assert whole.to_dict()["store"] is True and whole.instructions == "Repeat."

    with served.responses.stream(model=ECHO, input=[{"role": "user", "content": said}]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:4]] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == said
    assert final.output_text == said and final.status == "completed"

    cut = served.responses.create(model=ECHO, input="abcdefgh", max_output_tokens=3)
    assert (cut.status, cut.output_text) == ("incomplete", "abc")
    assert cut.incomplete_details is not None and cut.incomplete_details.reason == "max_output_tokens"
    # vLLM's sampling fields, as its server takes them here.
    stopped = served.responses.create(model=ECHO, input=said, extra_body={"stop": [" there"]})
    assert (stopped.status, stopped.output_text) == ("completed", "Hello")
    kept = served.responses.create(
        model=ECHO, input=said, extra_body={"stop": [" there"], "include_stop_str_in_output": True}
    )
    assert kept.output_text == "Hello there"


def test_kept_responses_are_retrieved_continued_and_deleted(served: openai.OpenAI) -> None:
    first = served.responses.create(model=ECHO, input="remember this")
    kept = served.responses.retrieve(first.id)
    assert (kept.id, kept.status, kept.output_text) == (first.id, "completed", "remember this")
    assert kept.usage is not None and kept.usage.output_tokens == len("remember this")

    # The echo repeats the conversation's last user message: here only the earlier one has it.
    go_on: Any = [{"role": "developer", "content": "go on"}]
    with pytest.raises(openai.BadRequestError) as alone:
        served.responses.create(model=ECHO, input=go_on)
    assert alone.value.body["param"] == "input"  # type: ignore[index]
    second = served.responses.create(model=ECHO, input=go_on, previous_response_id=first.id)
    assert second.output_text == "remember this" and second.previous_response_id == first.id
    third = served.responses.create(model=ECHO, input="and this", previous_response_id=second.id)
    assert third.output_text == "and this"

    # The AI SDK sends an earlier reply as a reference to its output message.
    referring: Any = [
        {"role": "user", "content": "again"},
        {"type": "item_reference", "id": first.output[0].id},
        {"role": "user", "content": "once more"},
    ]
    assert served.responses.create(model=ECHO, input=referring).output_text == "once more"
    referring[1]["id"] = "msg_nothing"
    with pytest.raises(openai.NotFoundError) as unreferable:
        served.responses.create(model=ECHO, input=referring)
    assert unreferable.value.body["param"] == "input[1].id"  # type: ignore[index]

    served.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        served.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        served.responses.create(model=ECHO, input=go_on, previous_response_id=first.id)
    assert gone.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        served.responses.retrieve("resp_nothing")


def test_store_false_keeps_nothing(served: openai.OpenAI) -> None:
    unkept = served.responses.create(model=ECHO, input="forget me", store=False)
    assert unkept.output_text == "forget me" and unkept.to_dict()["store"] is False
    with pytest.raises(openai.NotFoundError) as missing:
        served.responses.retrieve(unkept.id)
    assert missing.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as named:
        served.responses.create(model=ECHO, input="x", previous_response_id=unkept.id)
    assert named.value.body["param"] == "previous_response_id"  # type: ignore[index]

    with served.responses.stream(model=ECHO, input="streamed, unkept", store=False) as stream:
        final = stream.get_final_response()
    assert final.output_text == "streamed, unkept"
    with pytest.raises(openai.NotFoundError):
        served.responses.retrieve(final.id)


def test_options_this_server_cannot_honour_are_refused_by_name(
    module_toolkit: Toolkit, served: openai.OpenAI
) -> None:
    refused: list[tuple[dict[str, Any], str]] = [
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].type"),
        ({"frobnicate": 1}, "frobnicate"),
        # Passed on as chat's response_format; the model's replica refuses it, named as here.
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ]
    with module_toolkit.client() as client:
        for extra, param in refused:
            answer = client.post(PREFIX + "/v1/responses", json={"model": ECHO, "input": "hi", **extra})
            assert answer.status_code == 400, (extra, answer.text)
            assert answer.json()["error"]["param"] == param
        whole = served.responses.create(model=ECHO, input="not streamed")
        unstreamed = client.get(f"{PREFIX}/v1/responses/{whole.id}", params={"stream": "true"})
        assert unstreamed.status_code == 400 and unstreamed.json()["error"]["param"] == "stream"


def test_a_dropped_stream_resumes_after_its_last_sequence_number(
    module_toolkit: Toolkit, served: openai.OpenAI
) -> None:
    """2,000 bytes take the echo 2 s: the client reads a few events and leaves, comes back
    for a few more and leaves again; the reply ends with no reader; the rest is then read.
    Together the parts are the whole stream, no event missing or repeated."""
    said = "".join(f"{n:04d} " for n in range(400))
    body = {"model": ECHO, "input": said, "stream": True}
    with module_toolkit.client() as client:
        with client.stream("POST", PREFIX + "/v1/responses", json=body) as posted:
            head = _events(posted.iter_lines(), 5)
        response_id = head[0]["response"]["id"]
        url = f"{PREFIX}/v1/responses/{response_id}"
        resume = {"stream": "true", "starting_after": str(head[-1]["sequence_number"])}
        with client.stream("GET", url, params=resume) as resumed:
            middle = _events(resumed.iter_lines(), 5)
        assert client.get(url).json()["status"] == "in_progress"

        deadline = time.monotonic() + 20
        while (status := client.get(url).json()["status"]) == "in_progress" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status == "completed"

        rest_from = {"stream": "true", "starting_after": str(middle[-1]["sequence_number"])}
        with client.stream("GET", url, params=rest_from) as rest_stream:
            rest = _events(rest_stream.iter_lines())
        with client.stream("GET", url, params={"stream": "true"}) as replay:
            everything = _events(replay.iter_lines())

    parts = head + middle + rest
    assert [e["sequence_number"] for e in parts] == list(range(len(parts)))
    assert parts == everything
    assert parts[-1]["type"] == "response.completed"
    assert parts[-1]["response"]["output_text"] == said
    assert "".join(e["delta"] for e in parts if e["type"] == "response.output_text.delta") == said

    # The official client resumes too (it reads the stream again and skips what it had).
    with served.responses.stream(response_id=response_id, starting_after=4) as again:
        numbers = [event.sequence_number for event in again]
    assert numbers == list(range(5, len(parts)))


def test_a_stream_open_at_the_ingress_drain_deadline_ends_with_the_retry_error(toolkit: Toolkit) -> None:
    """The app is deleted mid-reply: at the ingress's drain deadline (1 s) the stream ends
    with OpenAI's error event saying the server restarts, numbered after what was sent."""
    args = {
        "llm_configs": [
            {
                "model_loading_config": {"model_id": ECHO},
                "llm_engine": "echo",
                "engine_kwargs": {"max_model_len": 32_768},
            }
        ],
        "ingress_deployment_config": {"graceful_shutdown_timeout_s": 1},
    }
    toolkit.run(build_openai_app(args), route_prefix=DRAINED)
    # 12 s at the echo's pace: still under way at the deadline however slowly the delete begins.
    body = {"input": "x" * 12_000, "stream": True}
    with toolkit.client() as client, client.stream("POST", DRAINED + "/v1/responses", json=body) as posted:
        lines = posted.iter_lines()
        head = _events(lines, 5)
        deleting = threading.Thread(target=toolkit.cleanup)
        deleting.start()
        rest = _events(lines)
        deleting.join()
    last = rest[-1]
    assert (last["type"], last.get("code")) == ("error", "server_restarting"), rest[-3:]
    assert last["sequence_number"] > (rest[-2] if len(rest) > 1 else head[-1])["sequence_number"]
    assert not any(event["type"] == "response.completed" for event in rest)
