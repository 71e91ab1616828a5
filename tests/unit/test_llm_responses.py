"""A Responses API request read into what the model's replica takes: input items as chat
messages, ``text.format`` as ``response_format``, and a model's refusal renamed to this
API's parameters."""

from __future__ import annotations

from typing import Any

import pytest

from app_toolkit.llm.errors import OpenAIError, bad_parameter
from app_toolkit.llm.openai.responses import ResponsesRequest, generation, renamed


def _nothing_kept(item_id: str, param: str) -> dict[str, Any]:
    raise AssertionError(f"no reference expected, got {item_id} at {param}")


def test_input_items_become_chat_messages_after_the_instructions() -> None:
    earlier = ({"role": "user", "content": "before"}, {"role": "assistant", "content": "reply"})
    request = ResponsesRequest(
        input=[
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "b", "annotations": []}]},
        ],
        instructions="system says",
        max_output_tokens=5,
    )
    made = generation(request, earlier + request.messages(_nothing_kept), 0.0)
    assert made.messages == (
        {"role": "system", "content": "system says"},
        *earlier,
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
    )
    assert (made.sampling.max_tokens, made.max_tokens_given, made.response_format) == (5, True, None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ({"format": {"type": "text"}}, None),
        ({"format": {"type": "json_object"}}, {"type": "json_object"}),
        (
            {"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}, "strict": True}},
            {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": {"type": "object"}, "strict": True},
            },
        ),
    ],
)
def test_text_format_is_chat_completions_response_format(
    text: dict[str, Any], expected: dict[str, Any] | None
) -> None:
    assert ResponsesRequest(input="x", text=text).response_format() == expected


def test_refusals_name_this_apis_parameters() -> None:
    assert renamed(bad_parameter("response_format.json_schema.schema", "bad")).param == "text.format.schema"
    assert renamed(bad_parameter("messages", "too long")).param == "input"
    kept = bad_parameter("temperature", "no")
    assert renamed(kept) is kept
    with pytest.raises(OpenAIError) as grammar:
        ResponsesRequest(input="x", text={"format": {"type": "regex"}}).response_format()
    assert grammar.value.param == "text.format.type"
    for wrong in ("json", ["json_object"]):  # not an object: a 400 naming it, not a 500
        with pytest.raises(OpenAIError) as shape:
            ResponsesRequest(input="x", text={"format": wrong}).response_format()
        assert (shape.value.status, shape.value.param) == (400, "text.format")
