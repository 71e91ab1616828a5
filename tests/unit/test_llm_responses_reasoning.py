"""``/v1/responses`` with a reasoning parser's split: the reasoning is an output item of its
own before the message, whole and streamed, in the order and shapes vLLM's server sends
(its ``SimpleStreamingEventProcessor``), read back with the official client's types; its
tokens count in the usage; a reply without reasoning is the message alone; reasoning a
client sends back is left out of the next prompt."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from app_toolkit.llm.errors import OpenAIError
from app_toolkit.llm.events import Delta, Generation
from app_toolkit.llm.openai import response_events, responses
from app_toolkit.llm.openai.replies import Whole
from app_toolkit.llm.openai.response_store import ResponseStore
from app_toolkit.llm.openai.responses import Event, Reply, ResponsesRequest
from tests.model_replies import GivenReply

THOUGHT = ("The user ", "wants the weather.")
ANSWER = ("It is ", "sunny.")
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def _reply(**fields: Any) -> Reply:
    request = ResponsesRequest.model_validate({"input": "What is the weather?", **fields}).checked()
    return Reply(request, "m", 7, ({"role": "user", "content": "What is the weather?"},))


def _streamed(deltas: Sequence[Delta]) -> list[dict[str, Any]]:
    async def read() -> list[Event]:
        return [event async for event in response_events.produced(_reply(stream=True), GivenReply(deltas))]  # type: ignore[arg-type]

    events = [json.loads(data) for _, data in asyncio.run(read())]
    for event in events:
        EVENTS.validate_python(event)  # each as the official client reads it
    return events


def _deltas(thought: Sequence[str], reasoning_tokens: int | None) -> list[Delta]:
    return [
        *(Delta(reasoning=piece) for piece in thought),
        *(Delta(text=piece) for piece in ANSWER),
        Delta(finish_reason="stop", completion_tokens=9, reasoning_tokens=reasoning_tokens),
    ]


def test_the_reasoning_streams_as_an_item_of_its_own_before_the_message() -> None:
    events = _streamed(_deltas(THOUGHT, 5))
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    opened, part = events[2], events[3]
    reasoning_id = opened["item"]["id"]
    assert reasoning_id.startswith("rs_") and opened["output_index"] == 0
    assert opened["item"] == {
        "id": reasoning_id,
        "type": "reasoning",
        "summary": [],
        "content": None,
        "encrypted_content": None,
        "status": "in_progress",
    }
    assert part["part"] == {"type": "reasoning_text", "text": ""}
    thought = "".join(THOUGHT)
    for event in events[4:8]:
        assert (event["item_id"], event["output_index"], event["content_index"]) == (reasoning_id, 0, 0)
    assert [event["delta"] for event in events[4:6]] == list(THOUGHT)
    assert events[6]["text"] == thought and events[7]["part"]["text"] == thought
    done = events[8]["item"]
    assert (events[8]["output_index"], done["id"]) == (0, reasoning_id)
    assert done["status"] == "completed" and done["content"] == [{"type": "reasoning_text", "text": thought}]
    message_id = events[9]["item"]["id"]
    assert message_id.startswith("msg_") and events[9]["output_index"] == 1
    for event in events[10:15]:
        assert (event["item_id"], event["output_index"]) == (message_id, 1)
    assert (events[15]["output_index"], events[15]["item"]["id"]) == (1, message_id)
    final = Response.model_validate(events[-1]["response"])
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == "".join(ANSWER)
    assert final.usage is not None and final.usage.output_tokens_details.reasoning_tokens == 5


def test_a_reply_read_whole_has_the_reasoning_item_first_and_counts_its_tokens() -> None:
    whole = Whole(text="".join(ANSWER), reasoning="".join(THOUGHT), completion_tokens=9, reasoning_tokens=5)
    answered = Response.model_validate(_reply().read(whole))
    reasoning, message = answered.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.content is not None and [part.text for part in reasoning.content] == ["".join(THOUGHT)]
    assert message.type == "message" and answered.output_text == "".join(ANSWER)
    assert answered.usage is not None and answered.usage.output_tokens_details.reasoning_tokens == 5


@pytest.mark.parametrize("stream", [False, True])
def test_without_reasoning_the_message_is_the_only_item(stream: bool) -> None:
    """No reasoning parser (nothing counted), or ``include_reasoning: false`` (counted, not
    shown): the message at index 0, as before."""
    for counted in (None, 5):
        if stream:
            events = _streamed(_deltas((), counted))
            assert [event["type"] for event in events[:4]] == [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
            ]
            assert events[2]["output_index"] == 0 and events[2]["item"]["type"] == "message"
            answered = Response.model_validate(events[-1]["response"])
        else:
            whole = Whole(text="".join(ANSWER), completion_tokens=9, reasoning_tokens=counted)
            answered = Response.model_validate(_reply().read(whole))
        assert [item.type for item in answered.output] == ["message"]
        assert answered.usage is not None
        assert answered.usage.output_tokens_details.reasoning_tokens == (counted or 0)


def test_an_empty_reply_still_sends_its_message() -> None:
    events = _streamed([Delta(finish_reason="stop", completion_tokens=0)])
    kinds = [event["type"] for event in events]
    assert kinds[2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert Response.model_validate(events[-1]["response"]).output_text == ""


def test_the_request_asks_the_model_to_parse_the_reply_and_may_leave_the_reasoning_out() -> None:
    """The model's replica reads the reply with its parsers only when the generation asks
    (``parse``), as for chat; ``include_reasoning`` is vLLM's field here too."""
    conversation = ({"role": "user", "content": "hi"},)
    for stream, parse in ((False, "whole"), (True, "streamed")):
        request = ResponsesRequest.model_validate({"input": "hi", "stream": stream}).checked()
        asked: Generation = responses.generation(request, conversation, 0.0)
        assert (asked.parse, asked.include_reasoning) == (parse, True)
    hidden = ResponsesRequest.model_validate({"input": "hi", "include_reasoning": False}).checked()
    assert responses.generation(hidden, conversation, 0.0).include_reasoning is False


def test_reasoning_sent_back_is_left_out_of_the_next_prompt() -> None:
    """Clients send a response's whole output back (the openai client's ``input +=
    response.output``), or refer to its items by id (the AI SDK): the reasoning item is
    taken and left out of the prompt, as vLLM leaves a response's reasoning out of the next
    turn; its message comes back as the assistant's."""
    store = ResponseStore(max_kept=10, keep_s=60, max_producing=1, clock=lambda: 0.0)
    earlier = _reply()
    answered = earlier.read(
        Whole(text="It is sunny.", reasoning="The user wants the weather.", completion_tokens=9)
    )
    store.keep(earlier)
    sent_back = [*answered["output"], {"role": "user", "content": "And tomorrow?"}]
    asked = ResponsesRequest.model_validate({"input": sent_back}).checked()
    assert asked.messages(store.referenced) == (
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "And tomorrow?"},
    )
    by_id = [{"type": "item_reference", "id": item["id"]} for item in answered["output"]]
    referring = ResponsesRequest.model_validate(
        {"input": [*by_id, {"role": "user", "content": "And tomorrow?"}]}
    )
    assert referring.checked().messages(store.referenced) == asked.messages(store.referenced)
    with pytest.raises(OpenAIError) as unknown:  # an id no kept response has is still a 404
        ResponsesRequest.model_validate({"input": [{"type": "item_reference", "id": "rs_x"}]}).messages(
            store.referenced
        )
    assert (unknown.value.status, unknown.value.param) == (404, "input[0].id")
