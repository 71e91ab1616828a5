"""A reply whose model replica was lost goes on from its text so far: each backend
continues it, or says it cannot."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from app_toolkit.llm import OpenAIError

from {{ cookiecutter.package_name }}.engines.echo import EchoEngine
from {{ cookiecutter.package_name }}.engines.upstream import UpstreamEngine
from {{ cookiecutter.package_name }}.schemas import Generation

from .conftest import ECHO


def _generation(prefix: str = "") -> Generation:
    return Generation(messages=(("user", "one two three four five"),), max_tokens=10, prefix=prefix)


async def _pieces(engine: EchoEngine, generation: Generation) -> list[str]:
    return [piece async for piece in engine.stream(generation)]


def test_the_echo_model_continues_after_the_words_it_already_said() -> None:
    engine = EchoEngine(ECHO.model_copy(update={"echo_tokens_per_s": 10_000}))
    whole = asyncio.run(_pieces(engine, _generation()))
    assert "".join(whole) == "one two three four five"
    rest = asyncio.run(_pieces(engine, _generation(prefix="".join(whole[:2]))))
    assert rest == whole[2:]  # no repeats, no gap
    assert engine.count_prompt(_generation(prefix="one two ")) == engine.count_prompt(_generation()) + 2


def test_an_upstream_continues_a_reply_only_if_told_it_can() -> None:
    engine = UpstreamEngine(ECHO.model_copy(update={"backend": "openai"}))

    async def first_piece() -> None:
        async for _ in engine.stream(_generation(prefix="one two ")):
            break

    with pytest.raises(OpenAIError, match="CHAT_UPSTREAM_CONTINUES"):
        asyncio.run(first_piece())


def test_an_upstream_that_can_continue_gets_the_partial_reply_as_vllm_expects() -> None:
    sent: list[dict[str, object]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        chunk = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "three"}, "finish_reason": None}],
        }
        body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    engine = UpstreamEngine(ECHO.model_copy(update={"backend": "openai", "upstream_continues": True}))
    engine._client = openai.AsyncOpenAI(  # the wire, replaced: only the request's shape is checked
        base_url="http://upstream.invalid/v1",
        api_key="none",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(upstream)),
    )

    async def pieces() -> list[str]:
        return [piece async for piece in engine.stream(_generation(prefix="one two "))]

    assert asyncio.run(pieces()) == ["three"]
    body = sent[0]
    assert body["messages"] == [
        {"role": "user", "content": "one two three four five"},
        {"role": "assistant", "content": "one two "},
    ]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False


def test_a_generation_goes_through_json_unchanged() -> None:
    generation = Generation(
        messages=(("system", "Be brief."), ("user", "hi")),
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        stop=("\n\n",),
        upstream_options=(("seed", 3), ("response_format", {"type": "json_object"})),
        prefix="Hello",
    )
    stored = json.loads(json.dumps(generation.to_json()))  # as the reply store keeps it
    assert Generation.from_json(stored) == generation
