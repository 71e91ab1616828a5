"""Message content as the model reads it: text parts joined, other parts refused by name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app_toolkit.llm.errors import OpenAIError, invalid_request
from app_toolkit.llm.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    role_of,
    text_content,
)


def test_text_parts_of_both_apis_are_joined_by_newlines() -> None:
    parts = [
        {"type": "text", "text": "red"},
        {"type": "input_text", "text": "green"},
        {"type": "output_text", "text": "blue", "annotations": []},
    ]
    assert text_content(parts, "messages[0].content") == "red\ngreen\nblue"
    assert text_content("as it is", "messages[0].content") == "as it is"
    assert text_content(None, "messages[0].content") == ""


@pytest.mark.parametrize(
    ("part", "kind"),
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "'image_url'"),
        ({"type": "text"}, "'text'"),  # a text part without its text
        ("just a string", "'str'"),
    ],
)
def test_any_other_part_is_refused_naming_its_place(part: object, kind: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        text_content([{"type": "text", "text": "hi"}, part], "input[2].content")
    error = refused.value
    assert (error.status, error.code) == (400, "unsupported_parameter")
    assert error.param == "input[2].content[1].type"
    assert kind in error.message


def test_roles_are_the_chat_templates_and_any_other_is_refused_by_name() -> None:
    assert role_of("developer", "input[0].role") == "system"
    with pytest.raises(OpenAIError) as refused:
        role_of("tool", "input[3].role")
    assert (refused.value.param, refused.value.code) == ("input[3].role", "unsupported_parameter")


@pytest.mark.parametrize(
    ("given", "inputs"),
    [
        ("one text", ["one text"]),
        (["a", "b"], ["a", "b"]),
        ([101, 7, 102], [[101, 7, 102]]),  # one input as token ids
        ([[101, 102], [5]], [[101, 102], [5]]),
    ],
)
def test_embeddings_take_texts_or_token_ids(given: object, inputs: list[object]) -> None:
    assert EmbeddingRequest.model_validate({"input": given}).inputs() == inputs


@pytest.mark.parametrize("given", ["", [], ["a", ""], [[1], []], ["x"] * 2_049])
def test_an_empty_input_or_too_many_are_a_400_naming_input(given: object) -> None:
    with pytest.raises(OpenAIError) as refused:
        EmbeddingRequest.model_validate({"input": given}).inputs()
    assert refused.value.status == 400 and refused.value.param == "input"


def test_a_requests_first_invalid_field_is_named_in_the_order_it_always_was() -> None:
    """The sampling fields chat, completions and the Responses API share come after the
    head of chat's and completions' requests: a 400 with several faults names ``n``."""
    for kind, required in ((ChatCompletionRequest, {"messages": []}), (CompletionRequest, {"prompt": "x"})):
        assert list(kind.model_fields)[:7] == [
            "model", "n", "stream", "stream_options", "max_tokens", "temperature", "top_p",
        ]  # fmt: skip
        with pytest.raises(ValidationError) as failed:
            kind.model_validate({**required, "n": 0, "seed": "x"})
        assert invalid_request(failed.value.errors()).param == "n"
