"""A Responses API request read into what the model's replica takes: input items as chat
messages, ``text.format`` as ``response_format``, and a model's refusal renamed to this
API's parameters."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app_toolkit.llm.errors import OpenAIError, bad_parameter
from app_toolkit.llm.events import StructuredOutputs
from app_toolkit.llm.openai.responses import ResponsesRequest, generation, renamed
from app_toolkit.llm.protocol import ChatCompletionRequest


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


def test_vllms_sampling_fields_reach_the_replica_as_chat_completions_take_them() -> None:
    """vLLM's server takes its sampling fields on /v1/responses too (they were an unknown
    parameter's 400 here): each reaches the generation as chat's does."""
    fields: dict[str, Any] = {
        "top_k": 5,
        "min_p": 0.1,
        "seed": 7,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.2,
        "logit_bias": {"3": 2.0},
        "stop": ["END"],
        "stop_token_ids": [2],
        "ignore_eos": True,
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "structured_outputs": {"choice": ["yes", "no"]},
    }
    request = ResponsesRequest(input="x", temperature=0.0, max_output_tokens=9, **fields).checked()
    made = generation(request, request.messages(_nothing_kept), 0.0)
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], temperature=0.0, **fields)
    assert made.sampling == chat.checked().sampling(9, 1.0)
    assert made.stops == ("END",) and made.include_stop_str_in_output and not made.skip_special_tokens
    assert made.response_format == StructuredOutputs({"choice": ["yes", "no"]})
    # The two ways of asking a format at once are refused, as vLLM's server refuses them.
    with pytest.raises(OpenAIError) as both:
        ResponsesRequest(input="x", text={"format": {"type": "json_object"}}, **fields).checked()
    assert (both.value.status, both.value.param) == (400, "structured_outputs")
    # Out of vLLM's bounds: the request's own validation (a 400 at the endpoint).
    with pytest.raises(ValidationError):
        ResponsesRequest(input="x", min_p=2.0)
