"""app_toolkit.llm's OpenAI endpoints on both backends, with the echo engine (no model):
the official openai client reads every endpoint, streamed and not; errors come in OpenAI's
shape with its status codes; the per-model metrics appear at /-/metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import APIRouter, Depends, HTTPException, Request, WebSocket
from fastapi.responses import PlainTextResponse
from prometheus_client.parser import text_string_to_metric_families
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

import app_toolkit as tk
from app_toolkit.code_sources import code_name
from app_toolkit.exceptions import BuilderArgsError, ConfigError
from app_toolkit.llm import LLMConfig, LLMServer, LLMServingArgs, build_llm_deployment, build_openai_app
from app_toolkit.llm.openai.ingress import OpenAIIngress
from app_toolkit.llm.openai.ingress_app import ingress_class
from tests.conftest import Toolkit
from tests.waiting import wait_for

ECHO = "org/echo-1"  # a model id with a "/", as Hugging Face names them
SECOND = "echo-two"
PREFIX = "/llm"


@pytest.fixture(scope="module")
def served(module_toolkit: Toolkit) -> Iterator[openai.OpenAI]:
    """Two echo models (one paced by stream_batching_interval_ms) behind one ingress."""
    args = {
        "llm_configs": [
            {"model_loading_config": {"model_id": ECHO}, "llm_engine": "echo"},
            {
                "model_loading_config": {"model_id": SECOND},
                "llm_engine": "echo",
                "engine_kwargs": {"max_model_len": 64},
                "experimental_configs": {"stream_batching_interval_ms": 100},
                # Two replies admitted at once: a request of more prompts must not wait on itself.
                "deployment_config": {"max_ongoing_requests": 2},
            },
        ]
    }
    module_toolkit.run(build_openai_app(args), route_prefix=PREFIX)
    with openai.OpenAI(
        base_url=module_toolkit.url + PREFIX + "/v1", api_key="none", max_retries=0, timeout=30
    ) as client:
        yield client


def test_models_are_listed_and_found_by_ids_with_slashes(served: openai.OpenAI) -> None:
    assert sorted(model.id for model in served.models.list()) == sorted([ECHO, SECOND])
    model = served.models.retrieve(ECHO)
    assert model.id == ECHO and model.object == "model"
    with pytest.raises(openai.NotFoundError) as caught:
        served.models.retrieve("nope/nothing")
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_chat_whole_and_streamed_with_usage(served: openai.OpenAI) -> None:
    said = "Hello there, café ☕ world"
    whole = served.chat.completions.create(model=ECHO, messages=[{"role": "user", "content": said}])
    assert whole.choices[0].message.content == said
    assert whole.choices[0].finish_reason == "stop"
    size = len(said.encode())
    assert whole.usage is not None and (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (
        size,
        size,
    )

    chunks = list(
        served.chat.completions.create(
            model=ECHO,
            messages=[{"role": "user", "content": said}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == said
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == size


def test_max_tokens_cuts_the_reply_with_finish_reason_length(served: openai.OpenAI) -> None:
    reply = served.chat.completions.create(
        model=ECHO, messages=[{"role": "user", "content": "abcdefgh"}], max_tokens=3
    )
    assert (reply.choices[0].message.content, reply.choices[0].finish_reason) == ("abc", "length")


def test_stop_strings_end_the_reply_without_them(served: openai.OpenAI) -> None:
    reply = served.chat.completions.create(
        model=ECHO, messages=[{"role": "user", "content": "one two STOP three"}], stop=["STOP"]
    )
    assert (reply.choices[0].message.content, reply.choices[0].finish_reason) == ("one two ", "stop")
    # A stop string counts only in text after min_tokens tokens, as in vLLM (a token a byte here).
    plain = served.completions.create(model=ECHO, prompt="a.b.c", stop=["."], max_tokens=100)
    held: Any = {"min_tokens": 3}
    later = served.completions.create(model=ECHO, prompt="a.b.c", stop=["."], max_tokens=100, extra_body=held)
    assert (plain.choices[0].text, later.choices[0].text) == ("a", "a.b")
    # vLLM's include_stop_str_in_output keeps the stop string, whole and streamed.
    kept: Any = {"include_stop_str_in_output": True}
    included = served.completions.create(
        model=ECHO, prompt="a.b.c", stop=["."], max_tokens=100, extra_body=kept
    )
    assert (included.choices[0].text, included.choices[0].finish_reason) == ("a.", "stop")
    pieces = served.chat.completions.create(
        model=ECHO,
        messages=[{"role": "user", "content": "one STOP two"}],
        stop=["STOP"],
        stream=True,
        extra_body=kept,
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in pieces if chunk.choices) == "one STOP"


def test_completions_whole_streamed_and_echoed(served: openai.OpenAI) -> None:
    whole = served.completions.create(model=ECHO, prompt="complete me", max_tokens=100)
    assert whole.object == "text_completion" and whole.choices[0].text == "complete me"
    default = served.completions.create(model=ECHO, prompt="x" * 40)
    assert (
        default.choices[0].finish_reason == "length" and len(default.choices[0].text) == 16
    )  # OpenAI's default
    streamed = served.completions.create(model=ECHO, prompt="piece by piece", max_tokens=100, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "piece by piece"
    echoed = served.completions.create(model=ECHO, prompt="ab", max_tokens=100, echo=True)
    assert echoed.choices[0].text == "abab"
    ids = served.completions.create(model=ECHO, prompt=[104, 105], max_tokens=100)  # token ids
    assert ids.choices[0].text == "hi"


def test_logprobs_come_in_openai_shapes_whole_and_streamed(served: openai.OpenAI) -> None:
    """The echo engine has no model: each token is certain (log-probability 0)."""
    message: Any = [{"role": "user", "content": "héllo"}]
    whole = served.chat.completions.create(model=ECHO, messages=message, logprobs=True, top_logprobs=1)
    content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert [entry.logprob for entry in content] == [0.0] * len(content)
    assert all(entry.top_logprobs[0].token == entry.token for entry in content)
    assert b"".join(bytes(entry.bytes or ()) for entry in content).decode() == "héllo"  # é is two byte tokens
    assert served.chat.completions.create(model=ECHO, messages=message).choices[0].logprobs is None
    chunks = list(
        served.chat.completions.create(model=ECHO, messages=message, logprobs=True, stream=True, max_tokens=3)
    )
    streamed = [
        entry
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for entry in c.choices[0].logprobs.content or ()
    ]
    assert [entry.top_logprobs for entry in streamed] == [[]] * 3  # top_logprobs 0: none listed
    completion = served.completions.create(model=ECHO, prompt="abc", logprobs=2, max_tokens=100)
    shown = completion.choices[0].logprobs
    assert shown is not None and shown.tokens == ["a", "b", "c"] and shown.text_offset == [0, 1, 2]
    assert shown.token_logprobs == [0.0] * 3 and shown.top_logprobs == [{"a": 0.0}, {"b": 0.0}, {"c": 0.0}]
    pieces = list(
        served.completions.create(model=ECHO, prompt="abc", logprobs=0, max_tokens=100, stream=True)
    )
    offsets = [
        o
        for p in pieces
        if p.choices and p.choices[0].logprobs
        for o in p.choices[0].logprobs.text_offset or ()
    ]
    assert offsets == [0, 1, 2]


def test_n_choices_whole_and_streamed(served: openai.OpenAI) -> None:
    message: Any = [{"role": "user", "content": "again"}]
    whole = served.chat.completions.create(model=ECHO, messages=message, n=3, logprobs=True)
    assert [choice.index for choice in whole.choices] == [0, 1, 2]
    assert [choice.message.content for choice in whole.choices] == ["again"] * 3
    assert all(len(choice.logprobs.content or ()) == 5 for choice in whole.choices)  # type: ignore[union-attr]
    assert whole.usage is not None and whole.usage.completion_tokens == 15  # the choices' tokens, summed
    chunks = list(
        served.chat.completions.create(
            model=ECHO, messages=message, n=2, stream=True, stream_options={"include_usage": True}
        )
    )
    said = ["", ""]
    finished = []
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        said[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finished.append(choice.index)
    assert said == ["again", "again"] and sorted(finished) == [0, 1]
    assert (
        chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    )
    texts = served.completions.create(model=ECHO, prompt="ab", n=2, echo=True, max_tokens=100)
    assert [(choice.index, choice.text) for choice in texts.choices] == [(0, "abab"), (1, "abab")]


def test_a_list_of_prompts_gets_n_choices_each(served: openai.OpenAI) -> None:
    """vLLM's numbering: prompt i's choices are i * n to i * n + n - 1."""
    whole = served.completions.create(model=ECHO, prompt=["ab", "cde"], n=2, max_tokens=100, echo=True)
    assert [(choice.index, choice.text) for choice in whole.choices] == [
        (0, "abab"),
        (1, "abab"),
        (2, "cdecde"),
        (3, "cdecde"),
    ]
    assert whole.usage is not None and (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (5, 10)
    ids = served.completions.create(model=ECHO, prompt=[[104, 105], [106]], max_tokens=100)
    assert [choice.text for choice in ids.choices] == ["hi", "j"]
    chunks = list(
        served.completions.create(
            model=ECHO,
            prompt=["ab", "c"],
            max_tokens=100,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    said = ["", ""]
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            said[choice.index] += choice.text
    assert said == ["ab", "c"]
    assert chunks[-1].usage is not None and (
        chunks[-1].usage.prompt_tokens,
        chunks[-1].usage.completion_tokens,
    ) == (3, 3)
    with pytest.raises(openai.BadRequestError) as outside:
        served.completions.create(model=ECHO, prompt=[[104], [10**6]])  # the second beyond the vocabulary
    assert outside.value.body["param"] == "prompt"  # type: ignore[index]
    # More prompts than the model admits replies at once: one request, fanned out in the replica.
    many = served.completions.create(
        model=SECOND, prompt=[f"p{k}" for k in range(6)], max_tokens=8, echo=True
    )
    assert [choice.text for choice in many.choices] == [f"p{k}p{k}" for k in range(6)]
    with pytest.raises(openai.BadRequestError) as too_many:
        served.completions.create(model=ECHO, prompt=["x"] * 65)
    assert too_many.value.body["param"] == "prompt"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as too_many_choices:
        served.completions.create(model=ECHO, prompt=["x"] * 8, n=9)
    assert too_many_choices.value.body["param"] == "n"  # type: ignore[index]


def test_model_may_be_left_out_only_when_one_model_fits(
    module_toolkit: Toolkit, served: openai.OpenAI
) -> None:
    with module_toolkit.client() as client:
        answer = client.post(
            PREFIX + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "model"


def test_errors_come_in_openai_shape_naming_the_parameter(served: openai.OpenAI) -> None:
    message: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError) as missing:
        served.chat.completions.create(model="gpt-nothing", messages=message)
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as several:
        served.chat.completions.create(model=ECHO, messages=message, n=17)  # at most 16 choices
    assert several.value.body["param"] == "n"  # type: ignore[index]
    # A field this server does not know is ignored (and logged once), as vLLM ignores it.
    assert served.chat.completions.create(model=ECHO, messages=message, extra_body={"frobnicate": 1}).choices
    with pytest.raises(openai.BadRequestError) as bad:
        served.chat.completions.create(model=ECHO, messages=message, temperature=5)
    assert bad.value.body["param"] == "temperature"  # type: ignore[index]
    long: Any = [{"role": "user", "content": "y" * 100}]  # SECOND's window is 64 tokens
    with pytest.raises(openai.BadRequestError) as too_long:
        served.chat.completions.create(model=SECOND, messages=long)
    assert too_long.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as too_many:
        served.chat.completions.create(model=SECOND, messages=message, max_tokens=63)
    assert too_many.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as image:
        served.chat.completions.create(
            model=ECHO,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}],
        )
    assert image.value.body["param"] == "messages[0].content[0].type"  # type: ignore[index]


def test_bad_token_ids_tools_and_stream_options_are_400s_naming_the_field(served: openai.OpenAI) -> None:
    for echo in (False, True):
        with pytest.raises(openai.BadRequestError) as outside:
            served.completions.create(model=ECHO, prompt=[104, 10**6], echo=echo)  # beyond the vocabulary
        assert outside.value.body["param"] == "prompt"  # type: ignore[index]
    message: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as tool:
        served.chat.completions.create(model=ECHO, messages=message, tools=[{"type": "web_search"}])  # type: ignore[list-item]
    assert tool.value.body["param"].startswith("tools")  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as no_tools:
        served.chat.completions.create(model=ECHO, messages=message, tool_choice="required")
    assert no_tools.value.body["param"] == "tool_choice"  # type: ignore[index]
    as_dict: Any = [*message, {"role": "assistant", "tool_calls": {"id": "x"}}]
    with pytest.raises(openai.BadRequestError) as not_a_list:
        served.chat.completions.create(model=ECHO, messages=as_dict)
    assert not_a_list.value.body["param"] == "messages[1].tool_calls"  # type: ignore[index]
    call: Any = [
        *message,
        {"role": "assistant", "tool_calls": [{"id": "x"}]},
        {"role": "user", "content": "go"},
    ]
    with pytest.raises(openai.BadRequestError) as bad_call:
        served.chat.completions.create(model=ECHO, messages=call, tools=[_TOOL], tool_choice="none")
    assert bad_call.value.body["param"] == "messages[1].tool_calls[0]"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as usage:
        usage_options: Any = {"continuous_usage_stats": True}  # vLLM's, not in openai's types
        served.chat.completions.create(
            model=ECHO, messages=message, stream=True, stream_options=usage_options
        )
    assert "continuous_usage_stats" in usage.value.body["param"]  # type: ignore[index]
    # The chat template's variables, as tool-calling clients send them; never its own arguments.
    thinking: Any = {"chat_template_kwargs": {"enable_thinking": False}}
    assert served.chat.completions.create(model=ECHO, messages=message, extra_body=thinking).choices
    with pytest.raises(openai.BadRequestError) as replaced:
        own: Any = {"chat_template_kwargs": {"chat_template": "{{ 'x' }}", "truncation": True}}
        served.chat.completions.create(model=ECHO, messages=message, extra_body=own)
    assert replaced.value.body["param"] == "chat_template_kwargs"  # type: ignore[index]
    # A prefill goes on with the last message; asking for the assistant's turn too is a 400.
    prefill: Any = {"add_generation_prompt": False, "continue_final_message": True}
    said = [*message, {"role": "assistant", "content": "Hel"}]
    assert served.chat.completions.create(model=ECHO, messages=said, extra_body=prefill).choices
    with pytest.raises(openai.BadRequestError) as both:
        served.chat.completions.create(model=ECHO, messages=said, extra_body={"continue_final_message": True})
    assert both.value.body["param"] == "continue_final_message"  # type: ignore[index]
    # Without a generation prompt the reply goes on with the last message: its role, as vLLM.
    unprompted: Any = {"add_generation_prompt": False}
    continued = served.chat.completions.create(model=ECHO, messages=message, extra_body=unprompted)
    role: str = continued.choices[0].message.role  # openai's types say "assistant" only
    assert role == "user"
    streamed = served.chat.completions.create(
        model=ECHO, messages=message, extra_body=unprompted, stream=True
    )
    assert [chunk.choices[0].delta.role for chunk in streamed if chunk.choices][0] == "user"
    with pytest.raises(openai.BadRequestError) as auto_without_tools:
        served.chat.completions.create(model=ECHO, messages=message, tool_choice="auto")
    assert auto_without_tools.value.body["param"] == "tool_choice"  # type: ignore[index]
    assert "`tools` must be set" in auto_without_tools.value.body["message"]  # type: ignore[index]
    for create in (served.chat.completions.create, served.completions.create):
        whole: Any = {"messages": message} if create == served.chat.completions.create else {"prompt": "hi"}
        with pytest.raises(openai.BadRequestError) as not_streamed:
            create(model=ECHO, stream=False, stream_options={"include_usage": True}, **whole)
        assert not_streamed.value.body["param"] == "stream_options"  # type: ignore[index]
        for seed in (2**63, -(2**63) - 1):  # past a signed 64-bit integer, as vLLM bounds it
            with pytest.raises(openai.BadRequestError) as too_big:
                create(model=ECHO, seed=seed, **whole)
            assert too_big.value.body["param"] == "seed"  # type: ignore[index]
        assert create(model=ECHO, seed=2**63 - 1, max_tokens=2, **whole).choices
        for stop_token in (-1, 10**6):  # outside the vocabulary
            with pytest.raises(openai.BadRequestError) as outside_stop:
                create(model=ECHO, extra_body={"stop_token_ids": [stop_token]}, **whole)
            assert outside_stop.value.body["param"] == "stop_token_ids"  # type: ignore[index]
        # OpenAI's penalties and bias and vLLM's sampling extras are taken (the echo engine
        # repeats the prompt whatever they say); out of vLLM's bounds, a 400 naming the field.
        sampled: Any = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "min_tokens": 1}
        penalties: Any = {"presence_penalty": 1, "frequency_penalty": -1, "logit_bias": {"104": 3}}
        assert create(model=ECHO, extra_body=sampled, **penalties, **whole).choices
        for refused, param in (
            ({"presence_penalty": 2.5}, "presence_penalty"),
            ({"logit_bias": {"104": 1, "1000000": 1}}, "logit_bias"),  # outside the vocabulary
            ({"logit_bias": {"h": 1}}, "logit_bias"),
            ({"max_tokens": 2, "extra_body": {"min_tokens": 3}}, "min_tokens"),
            ({"extra_body": {"top_k": -2}}, "top_k"),
        ):
            with pytest.raises(openai.BadRequestError) as out_of_bounds:
                create(model=ECHO, **refused, **whole)
            assert out_of_bounds.value.body["param"] == param, refused  # type: ignore[index]
    unbounded = served.completions.create(model=ECHO, prompt="no cap", max_tokens=None)
    assert unbounded.choices[0].text == "no cap"  # null: up to the context window, as vLLM reads it


_TOOL: Any = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def test_health_and_version_answer_as_vllms(module_toolkit: Toolkit, served: openai.OpenAI) -> None:
    with module_toolkit.client() as client:
        health = client.get(PREFIX + "/health")
        assert (health.status_code, health.content) == (200, b"")
        assert client.get(PREFIX + "/version").json() == {"version": tk.__version__}


def test_status_names_the_engine_each_model_replica_runs(
    module_toolkit: Toolkit, served: openai.OpenAI
) -> None:
    """Which engine runs is never silent: each model replica's routing stats name it."""

    def engines() -> dict[str, set[object]]:
        found: dict[str, set[object]] = {}
        for app in tk.status().applications.values():
            for name, deployment in app.deployments.items():
                if name.startswith("LLMServer"):
                    found[name] = {replica.routing_stats.get("engine") for replica in deployment.replicas}
        return found

    # The first sample is taken as a replica starts; it reaches the controller with the
    # replica's next load report.
    wait_for(lambda: len(engines()) == 2 and all(seen == {"echo"} for seen in engines().values()), 20)


def test_tokenize_and_detokenize(module_toolkit: Toolkit, served: openai.OpenAI) -> None:
    with module_toolkit.client() as client:
        tokens = client.post(PREFIX + "/tokenize", json={"model": ECHO, "prompt": "hé"}).json()
        assert tokens["tokens"] == list("hé".encode()) and tokens["count"] == 3
        assert tokens["max_model_len"] == 4096
        chat = client.post(
            PREFIX + "/tokenize", json={"model": ECHO, "messages": [{"role": "user", "content": "ab"}]}
        ).json()
        assert chat["tokens"] == [97, 98]
        said = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"}]
        both = client.post(
            PREFIX + "/tokenize", json={"model": ECHO, "messages": said, "continue_final_message": True}
        )
        assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
        prefill = {
            "model": ECHO,
            "messages": said,
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
        assert client.post(PREFIX + "/tokenize", json=prefill).json()["tokens"] == [97, 98]
        text = client.post(PREFIX + "/detokenize", json={"model": ECHO, "tokens": tokens["tokens"]}).json()
        assert text == {"prompt": "hé"}
        bad = client.post(PREFIX + "/detokenize", json={"model": ECHO, "tokens": [10**9]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_stream_batching_applies_after_the_first_piece(
    module_toolkit: Toolkit, served: openai.OpenAI
) -> None:
    """SECOND sends pieces at most every 100 ms after the first: the first piece is one
    token, and the 30 more (30 ms at the echo's 1000 tokens/s) come in few chunks."""
    with module_toolkit.client() as client:
        body = {"model": SECOND, "stream": True, "messages": [{"role": "user", "content": "z" * 31}]}
        with client.stream("POST", PREFIX + "/v1/chat/completions", json=body) as response:
            pieces = [
                json.loads(line[6:])["choices"][0]["delta"].get("content")
                for line in response.iter_lines()
                if line.startswith("data: {")
            ]
    texts = [piece for piece in pieces if piece]
    assert texts[0] == "z" and "".join(texts) == "z" * 31
    assert len(texts) <= 3


def test_per_model_metrics_after_a_request(module_toolkit: Toolkit, served: openai.OpenAI) -> None:
    served.chat.completions.create(model=ECHO, messages=[{"role": "user", "content": "count me"}])
    wanted = {
        "llm_time_to_first_token_seconds_count",
        "llm_time_per_output_token_seconds_count",
        "llm_framework_seconds_count",
        "llm_queue_seconds_count",
        "llm_prompt_tokens_total",
        "llm_generation_tokens_total",
    }
    deadline = time.monotonic() + 20
    found: set[str] = set()
    with httpx.Client(base_url=module_toolkit.url, timeout=10) as client:
        while time.monotonic() < deadline:
            text = client.get("/-/metrics").text
            found = {
                sample.name
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.labels.get("model") == ECHO and sample.value > 0
            }
            if wanted <= found:
                break
            time.sleep(0.2)
    assert wanted <= found, wanted - found


def test_a_model_needing_an_accelerator_the_cluster_lacks_shows_as_unplaced(ray_toolkit: Toolkit) -> None:
    """Never a silent hang: status() names the resource the model's replica waits for."""
    name = ray_toolkit.name()
    config = {
        "model_loading_config": {"model_id": "needs-a10g"},
        "llm_engine": "echo",
        "accelerator_type": "A10G",
    }
    ray_toolkit.run_many(
        [tk.RunTarget(build_openai_app({"llm_configs": [config]}), name=name, route_prefix="/unplaced")],
        wait_for_applications_running=False,
    )
    deadline = time.monotonic() + 30
    message = ""
    while time.monotonic() < deadline and "accelerator_type:A10G" not in message:
        app = tk.status().applications.get(name)
        deployment = app.deployments.get("LLMServer-needs-a10g") if app else None
        message = deployment.message if deployment else ""
        time.sleep(0.2)
    assert "accelerator_type:A10G" in message, message
    assert "no nodes can hold it" in message or "no node has" in message, message


class GatedServer(LLMServer):
    """A model whose replica loads only once the file ``gate`` exists (a slow load)."""

    async def __init__(self, llm_config: LLMConfig, gate: str) -> None:  # type: ignore[misc]  # awaited, as Ray Serve does
        deadline = time.monotonic() + 600  # only so that a failed test leaves no replica waiting
        while not Path(gate).exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await super().__init__(llm_config)


def test_a_model_is_listed_once_it_can_answer(toolkit: Toolkit, tmp_path: Path) -> None:
    gate = tmp_path / "loaded"
    model = build_llm_deployment(
        {"model_loading_config": {"model_id": "gated"}, "llm_engine": "echo"},
        deployment_cls=GatedServer,
        bind_kwargs={"gate": str(gate)},
    )
    gated = {"model_loading_config": {"model_id": "gated"}, "llm_engine": "echo"}
    ingress = ingress_class(
        OpenAIIngress, LLMServingArgs.model_validate({"llm_configs": [gated]}), keyed=False
    )
    app = tk.deployment(name="OpenAiIngress")(ingress).bind({"gated": model}, {"gated": "generate"})
    name = toolkit.name()
    toolkit.run_many(
        [tk.RunTarget(app, name=name, route_prefix="/gated")], wait_for_applications_running=False
    )
    with toolkit.client() as client:

        def routed() -> httpx.Response | None:
            answer = client.get("/gated/v1/models")
            return answer if answer.status_code == 200 else None

        # Loading: not listed (a client polling for readiness waits), and asked for by name,
        # a 503 that says when to retry.
        assert wait_for(routed, 60, "the ingress routed").json() == {"object": "list", "data": []}
        one = client.get("/gated/v1/models/gated")
        assert one.status_code == 503 and one.headers["retry-after"] == "1"
        assert one.json()["error"]["code"] == "model_not_ready"
        gate.touch()

        def listed() -> list[dict[str, Any]]:
            return list(client.get("/gated/v1/models").json()["data"])

        (entry,) = wait_for(listed, 60, "the model listed once loaded")
        assert entry["id"] == "gated" and entry["max_model_len"] == 4096
        assert entry["owned_by"] == "app_toolkit"  # this toolkit's own engine (vLLM's say "vllm")
        assert listed() == [entry]  # the same card each time: `created` does not change
        assert client.get("/gated/v1/models/gated").json() == entry


def test_the_api_key_argument_guards_every_route_as_vllms_does(
    local_toolkit: Toolkit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LLMServingArgs.api_key`` (vLLM's --api-key, plaintext) and ``VLLM_API_KEY``: every
    request to the app needs a key, whatever its path or method, before its body is read;
    the one 401 of the front's keys."""
    echo = {"model_loading_config": {"model_id": ECHO}, "llm_engine": "echo"}
    prefix = "/" + local_toolkit.name()
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    keyed_app = build_openai_app({"llm_configs": [echo], "api_key": ["first", "second"]})
    assert "first" not in repr(keyed_app.args)  # only the keys' hashes reach the ingress
    local_toolkit.run(keyed_app, route_prefix=prefix)
    monkeypatch.setenv("VLLM_API_KEY", "from-the-environment")
    local_toolkit.run(build_openai_app({"llm_configs": [echo]}), route_prefix=prefix + "-env")
    with local_toolkit.client() as client:
        for path in ("/v1/models", "/health", "/version", "/openapi.json", "/docs", "/nowhere"):
            refused = client.get(prefix + path)
            assert refused.status_code == 401, path
            assert refused.headers["www-authenticate"] == "Bearer"
            assert refused.json()["error"]["code"] == "invalid_api_key"
        assert client.head(f"{prefix}/health").status_code == 401
        # Refused before the body is read: no 400 for a body that is not JSON.
        assert client.post(f"{prefix}/v1/chat/completions", content=b"{not json").status_code == 401
        streamed = {"model": ECHO, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        assert client.post(f"{prefix}/v1/chat/completions", json=streamed).status_code == 401
        wrong_then_right = {"authorization": "Bearer third", "x-api-key": "first"}  # Authorization counts
        assert client.get(f"{prefix}/v1/models", headers=wrong_then_right).status_code == 401
        tokenize = {"model": ECHO, "prompt": "ab"}
        assert client.post(f"{prefix}/tokenize", json=tokenize).status_code == 401
        assert (
            client.post(f"{prefix}/tokenize", json=tokenize, headers={"x-api-key": "first"}).status_code
            == 200
        )
        twice = [("x-api-key", "first"), ("x-api-key", "first")]
        assert client.get(f"{prefix}/v1/models", headers=twice).status_code == 401
        env = client.get(f"{prefix}-env/v1/models", headers={"authorization": "Bearer from-the-environment"})
        assert env.status_code == 200
        assert (
            client.get(f"{prefix}-env/v1/models", headers={"authorization": "Bearer first"}).status_code
            == 401
        )
    with openai.OpenAI(base_url=f"{local_toolkit.url}{prefix}/v1", api_key="second", max_retries=0) as keyed:
        assert [model.id for model in keyed.models.list()] == [ECHO]
    with openai.OpenAI(base_url=f"{local_toolkit.url}{prefix}/v1", api_key="third", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()


def test_an_api_key_that_cannot_be_sent_is_refused_where_the_app_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    echo = {"model_loading_config": {"model_id": ECHO}, "llm_engine": "echo"}
    for keys, said in (([""], "may not be empty"), ([" padded"], "may not start or end with spaces")):
        with pytest.raises(BuilderArgsError, match=said) as refused:
            build_openai_app({"llm_configs": [echo], "api_key": keys})
        assert "padded" not in str(refused.value)
    monkeypatch.setenv("VLLM_API_KEY", "  ")
    with pytest.raises(BuilderArgsError, match="VLLM_API_KEY may not be empty"):
        build_openai_app({"llm_configs": [echo]})


more = APIRouter()


class _Stamp:
    """A middleware of the subclass: it marks every response it passes."""

    def __init__(self, app: ASGIApp, header: str) -> None:
        self.app, self.header = app, header.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (self.header, b"yes")]}
            await send(message)

        await self.app(scope, receive, stamped)


def _guard(request: Request) -> None:
    """A dependency of an extra route: it must keep running there."""
    if request.headers.get("x-let-in") != "yes":
        raise HTTPException(403, "no", headers={"x-why": "guard"})


class Bannered(OpenAIIngress):
    """An ingress of one's own (``ingress_cls_config``): a route, a middleware, a constructor
    argument, and an override of one of the OpenAI endpoints."""

    extra_routes = more
    middleware = [Middleware(_Stamp, header="x-stamped")]

    def __init__(self, *args: Any, banner: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.banner = banner

    @more.get("/banner")
    async def show_banner(self) -> dict[str, str]:
        return {"banner": self.banner}

    async def version(self) -> dict[str, str]:
        return {"version": f"{self.banner}-1"}

    @more.get("/page", response_class=PlainTextResponse, dependencies=[Depends(_guard)])
    async def page(self) -> str:
        return f"<{self.banner}>"

    @more.websocket("/live")
    async def live(self, socket: WebSocket) -> None:
        await socket.accept()
        await socket.send_text(self.banner)
        await socket.close()


def test_an_ingress_class_of_ones_own_and_vllms_cors_options(local_toolkit: Toolkit) -> None:
    """``ingress_cls_config``: a subclass's route, middleware, constructor argument and
    override (also named by import path); vLLM's CORS options, the CORS middleware outermost
    (a preflight is answered without a key, a 401 carries the CORS headers)."""
    echo = {"model_loading_config": {"model_id": ECHO}, "llm_engine": "echo"}
    prefix = "/" + local_toolkit.name()
    mine = {"ingress_cls": Bannered, "ingress_extra_kwargs": {"banner": "hello"}}
    local_toolkit.run(
        build_openai_app({"llm_configs": [echo], "ingress_cls_config": mine}), route_prefix=prefix
    )
    by_path = {**mine, "ingress_cls": f"{__name__}:Bannered"}
    cors = {"allowed_origins": ["https://chat.example"], "allow_credentials": True, "api_key": "k"}
    keyed = build_openai_app({"llm_configs": [echo], "ingress_cls_config": by_path, **cors})
    local_toolkit.run(keyed, route_prefix=prefix + "-keyed")
    with local_toolkit.client() as client:
        banner = client.get(f"{prefix}/banner")
        assert banner.json() == {"banner": "hello"} and banner.headers["x-stamped"] == "yes"
        assert client.get(f"{prefix}/version").json() == {"version": "hello-1"}  # the override
        listed = client.get(f"{prefix}/v1/models")  # the base's routes go on
        assert [m["id"] for m in listed.json()["data"]] == [ECHO] and listed.headers["x-stamped"] == "yes"
        # vLLM's default CORS: any origin, no credentials.
        anywhere = client.get(f"{prefix}/v1/models", headers={"origin": "https://any.example"})
        assert anywhere.headers["access-control-allow-origin"] == "*"
        # The keyed app's: one origin, credentials; a preflight needs no key.
        preflight = {"origin": "https://chat.example", "access-control-request-method": "POST"}
        answered = client.options(f"{prefix}-keyed/v1/chat/completions", headers=preflight)
        assert answered.status_code == 200
        assert answered.headers["access-control-allow-origin"] == "https://chat.example"
        assert answered.headers["access-control-allow-credentials"] == "true"
        other = client.options(
            f"{prefix}-keyed/v1/chat/completions", headers={**preflight, "origin": "https://x.example"}
        )
        assert other.status_code == 400
        refused = client.get(f"{prefix}-keyed/banner", headers={"origin": "https://chat.example"})
        assert refused.status_code == 401  # the subclass's routes need the app's keys too
        assert refused.headers["access-control-allow-origin"] == "https://chat.example"
        assert "x-stamped" not in refused.headers  # its middleware runs after the key check
        assert client.get(f"{prefix}-keyed/banner", headers={"x-api-key": "k"}).json() == {"banner": "hello"}
        # An extra route keeps its settings: its dependency, its response class.
        guarded = client.get(f"{prefix}/page")
        assert guarded.status_code == 403 and guarded.headers["x-why"] == "guard"  # its headers kept
        assert guarded.json()["error"]["message"] == "no"  # in OpenAI's shape
        page = client.get(f"{prefix}/page", headers={"x-let-in": "yes"})
        assert page.text == "<hello>" and page.headers["content-type"].startswith("text/plain")
    # A WebSocket of an extra route: served, and with the app's keys closed without one.
    ws_url = local_toolkit.url.replace("http", "ws")
    with connect(f"{ws_url}{prefix}/live", open_timeout=10) as socket:
        assert socket.recv(timeout=10) == "hello"
    with pytest.raises(InvalidStatus) as closed:
        connect(f"{ws_url}{prefix}-keyed/live", open_timeout=10)
    assert closed.value.response.status_code == 403  # refused before it is accepted
    with connect(
        f"{ws_url}{prefix}-keyed/live", additional_headers={"x-api-key": "k"}, open_timeout=10
    ) as socket:
        assert socket.recv(timeout=10) == "hello"


def test_an_ingress_class_that_is_not_the_modules_is_refused_where_the_app_is_built() -> None:
    echo = {"model_loading_config": {"model_id": ECHO}, "llm_engine": "echo"}
    with pytest.raises(ConfigError, match="must be a subclass of app_toolkit.llm.OpenAIIngress"):
        build_openai_app({"llm_configs": [echo], "ingress_cls_config": {"ingress_cls": "json:JSONDecoder"}})


def test_an_openai_apps_code_is_known_by_its_class_and_options_and_bad_ingress_classes_fail_early() -> None:
    """Two builds of the same options are the same code (a redeploy keeps the replicas);
    other CORS options are other code. An override that hides its parameters, a route that
    is not a method and constructor arguments that do not fit fail where the app is built."""
    echo = {"model_loading_config": {"model_id": ECHO}, "llm_engine": "echo"}
    args = LLMServingArgs.model_validate({"llm_configs": [echo]})
    first, second = (ingress_class(Bannered, args, keyed=False) for _ in range(2))
    assert first is not second and code_name(first) == code_name(second)
    other = LLMServingArgs.model_validate({"llm_configs": [echo], "allowed_origins": ["https://a.example"]})
    assert code_name(ingress_class(Bannered, other, keyed=False)) != code_name(first)

    class Hiding(OpenAIIngress):
        async def version(self, *args: Any, **kwargs: Any) -> dict[str, str]:
            return {}

    with pytest.raises(ConfigError, match="not take \\*args or \\*\\*kwargs"):
        ingress_class(Hiding, args, keyed=False)

    class Removed(OpenAIIngress):
        version = None  # type: ignore[assignment]

    with pytest.raises(ConfigError, match="must be a method"):
        ingress_class(Removed, args, keyed=False)
    wrong = {"ingress_cls": Bannered}  # its constructor needs a banner
    with pytest.raises(BuilderArgsError, match="ingress_extra_kwargs do not fit Bannered.*banner"):
        build_openai_app({"llm_configs": [echo], "ingress_cls_config": wrong})
