"""Chat front ends and OpenAI clients against the chat example on Ray, unchanged: the
official ``openai`` client's Responses API, LangChain's ``ChatOpenAI`` (Chat Completions
and Responses), and the Vercel AI SDK in Node (``@ai-sdk/openai-compatible`` and
``@ai-sdk/openai``, whose default is the Responses API). Content parts, the ``developer``
role, streaming, and a client that leaves stops the model's work. And tool calls relayed
by the ``openai`` backend from an upstream that makes them."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import time
from typing import Any, cast

import openai
import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolParam,
)

from examples.chat.chat.app import build_app
from examples.chat.chat.settings import Settings
from tests import plain_http
from tests.apps import openai_upstream
from tests.conftest import ROOT, Toolkit
from tests.waiting import wait_for

AI_SDK = ROOT / "tests" / "clients" / "ai_sdk"
#: 20 words a second: a 400-word reply runs for 20 s unless the client's leaving stops it.
ECHO = Settings(backend="echo", echo_tokens_per_s=20, max_model_replicas=1)
LONG = "word " * 400
PARTS = [{"type": "text", "text": "red green"}, {"type": "text", "text": "blue"}]


@pytest.fixture(scope="module")
def chat_url(module_ray_toolkit: Toolkit) -> str:
    """The chat app, deployed once for the module's clients (each reads its own replies;
    the counters they check are read before and after)."""
    module_ray_toolkit.run(build_app(ECHO), route_prefix="/")
    return module_ray_toolkit.url


def stats(base: str) -> dict[str, int]:
    counters: dict[str, int] = plain_http.get(f"{base}/api/stats", timeout=10).json()
    return counters


def assert_stops_generating(base: str, stopped_before: int) -> None:
    """The model ended the reply the client left: nothing active, one more stopped, and
    no more tokens made."""
    wait_for(lambda: stats(base)["active"] == 0, timeout_s=3)
    counters = stats(base)
    assert counters["stopped"] == stopped_before + 1
    time.sleep(0.3)
    assert stats(base)["tokens"] == counters["tokens"]


def test_the_official_client_on_the_responses_api(chat_url: str) -> None:
    with openai.OpenAI(base_url=f"{chat_url}/v1", api_key="unused", max_retries=0) as client:
        responses(client, chat_url)


def responses(client: openai.OpenAI, chat_url: str) -> None:
    made = client.responses.create(model="echo", input="good day", instructions="Be brief.")
    assert made.output_text == "good day" and made.status == "completed"
    with client.responses.stream(
        model="echo", input=[{"role": "user", "content": "one two three"}]
    ) as events:
        deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
        final = events.get_final_response()
    assert deltas == ["one ", "two ", "three"] and final.output_text == "one two three"
    assert final.usage is not None and final.usage.output_tokens == 3
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="echo", input="hi", previous_response_id="resp_1")
    assert refused.value.param == "previous_response_id"

    stopped = stats(chat_url)["stopped"]
    with client.responses.stream(model="echo", input=LONG) as events:
        next(event for event in events if event.type == "response.output_text.delta")
    assert_stops_generating(chat_url, stopped)


@pytest.mark.parametrize("responses_api", [False, True], ids=["chat-completions", "responses"])
def test_langchain(chat_url: str, responses_api: bool) -> None:
    llm = ChatOpenAI(
        base_url=f"{chat_url}/v1",
        api_key="unused",
        model="echo",
        max_retries=0,
        use_responses_api=responses_api,
    )
    conversation = [SystemMessage("Be brief."), HumanMessage(content=PARTS)]  # type: ignore[arg-type]
    reply = llm.invoke(conversation)
    assert reply.text == "red green blue"
    assert reply.usage_metadata is not None and reply.usage_metadata["output_tokens"] == 3
    assert "".join(chunk.text for chunk in llm.stream(conversation)) == "red green blue"

    async def leave_early() -> int:
        pieces = 0
        async for chunk in llm.astream([HumanMessage(LONG)]):
            pieces += bool(chunk.text)
            if pieces == 2:
                break
        return pieces

    stopped = stats(chat_url)["stopped"]
    assert asyncio.run(leave_early()) == 2
    assert_stops_generating(chat_url, stopped)


def ai_sdk(base: str, scenario: str) -> dict[str, Any]:
    node = shutil.which("node")
    assert node is not None, "Node.js is not installed (the test setup installs it: make test)"
    assert (AI_SDK / "node_modules").is_dir(), "run `npm ci` in tests/clients/ai_sdk (make test does)"
    done = subprocess.run(
        [node, "run.mjs", base, scenario], cwd=AI_SDK, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("provider", ["compatible", "responses"])
def test_the_vercel_ai_sdk(chat_url: str, provider: str) -> None:
    """``compatible``: ``@ai-sdk/openai-compatible`` (Chat Completions); ``responses``:
    ``@ai-sdk/openai``'s default model, which calls the Responses API."""
    generated = ai_sdk(chat_url, f"{provider}-generate")
    assert generated["text"] == "red green blue" and generated["finish"] == "stop"
    assert generated["usage"]["outputTokens"] == 3
    streamed = ai_sdk(chat_url, f"{provider}-stream")
    assert streamed["pieces"] == ["red ", "green ", "blue"] and streamed["text"] == "red green blue"
    assert streamed["usage"]["inputTokens"] == 5  # the system text and both parts were read

    stopped = stats(chat_url)["stopped"]
    assert ai_sdk(chat_url, f"{provider}-abort")["pieces"] == ["word "]
    assert_stops_generating(chat_url, stopped)


def tutorial_snippet(language: str, base: str) -> str:
    """The ``language`` code block of the tutorial's client section, aimed at ``base`` and
    the echo model."""
    text = (ROOT / "docs" / "tutorial-chat.md").read_text(encoding="utf-8")
    section = text[text.index("### From LangChain") : text.index("### What each request field does")]
    code: str
    (code,) = re.findall(rf"```{language}\n(.*?)```", section, re.S)
    return code.replace("http://127.0.0.1:8000", base).replace("SmolLM2-135M-Instruct", "echo")


def test_the_tutorials_client_snippets_run(chat_url: str) -> None:
    python = subprocess.run(
        [sys.executable, "-c", tutorial_snippet("python", chat_url)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert python.returncode == 0, python.stderr[-3000:]
    assert python.stdout == "red green blue\nWrite a haiku about the sea."
    node = shutil.which("node")
    assert node is not None
    javascript = subprocess.run(
        [node, "--input-type=module", "-"],
        input=tutorial_snippet("js", chat_url),
        cwd=AI_SDK,  # its node_modules
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert javascript.returncode == 0, javascript.stderr[-3000:]
    assert javascript.stdout == "Hello!\nWrite a haiku about the sea."


def test_the_client_files_are_locked() -> None:
    """The AI SDK comes from the committed lockfile, at the versions package.json names."""
    manifest = json.loads((AI_SDK / "package.json").read_text())
    locked = json.loads((AI_SDK / "package-lock.json").read_text())["packages"]
    for name, version in manifest["dependencies"].items():
        assert locked[f"node_modules/{name}"]["version"] == version


WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_the_openai_backend_relays_tool_calls_and_choices(ray_toolkit: Toolkit) -> None:
    """With an upstream that calls tools, a request for tools, several choices or a tool's
    result goes to it whole, and its answer comes back as it sent it: the official
    client's tool loop works through the chat app, plain and streamed."""
    ray_toolkit.run(openai_upstream.make_app(), route_prefix="/upstream")
    relay = Settings(backend="openai", upstream_url=f"{ray_toolkit.url}/upstream/v1", upstream_model="tooled")
    ray_toolkit.run(build_app(relay), route_prefix="/relayed")  # the module's echo chat has "/"
    question: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Weather in Paris?"}]
    with openai.OpenAI(base_url=f"{ray_toolkit.url}/relayed/v1", api_key="unused", max_retries=0) as client:
        called = client.chat.completions.create(model="tooled", messages=question, tools=[WEATHER])
        (call,) = called.choices[0].message.tool_calls or []
        assert called.choices[0].finish_reason == "tool_calls"
        assert isinstance(call, ChatCompletionMessageFunctionToolCall)  # WEATHER is a function
        assert (call.function.name, json.loads(call.function.arguments)) == ("weather", {"city": "Paris"})
        sent = plain_http.get(f"{ray_toolkit.url}/upstream/last", timeout=10).json()
        assert sent["tools"] == [WEATHER] and sent["model"] == "tooled"

        # The tool's result goes back as a `tool` message; the upstream answers in text.
        said = cast(
            ChatCompletionAssistantMessageParam, called.choices[0].message.model_dump(exclude_unset=True)
        )
        follow_up: list[ChatCompletionMessageParam] = [*question, said]
        follow_up.append({"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'})
        answered = client.chat.completions.create(model="tooled", messages=follow_up, tools=[WEATHER])
        assert answered.choices[0].message.content == "It is sunny. (0)"
        assert (
            plain_http.get(f"{ray_toolkit.url}/upstream/last", timeout=10).json()["messages"][-1]["role"]
            == "tool"
        )

        stream = client.chat.completions.create(
            model="tooled", messages=question, tools=[WEATHER], stream=True
        )
        arguments = ""
        finish = None
        for chunk in stream:
            for part in chunk.choices[0].delta.tool_calls or []:
                arguments += (part.function and part.function.arguments) or ""
            finish = chunk.choices[0].finish_reason or finish
        assert json.loads(arguments) == {"city": "Paris"} and finish == "tool_calls"

        several = client.chat.completions.create(model="tooled", messages=question, n=2)
        assert [choice.message.content for choice in several.choices] == ["plain (0)", "plain (1)"]
        # Text in, text out still takes the usual path (the upstream streams it).
        assert (
            client.chat.completions.create(model="tooled", messages=question).choices[0].message.content
            == "plain (0)"
        )
