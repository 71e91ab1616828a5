"""An engine of this toolkit on vLLM, loaded in the test's process for a module's tests."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from app_toolkit.llm import LLMConfig
from app_toolkit.llm.engine import EmbeddingEngine, TextEngine
from app_toolkit.llm.replica.loading import engine_for


@contextmanager
def loaded(loop: asyncio.AbstractEventLoop, config: dict[str, Any]) -> Iterator[TextEngine | EmbeddingEngine]:
    """The engine ``config`` names, loaded as a replica loads it (off ``loop``), then
    closed on ``loop``: vLLM's output handler runs on the loop of its first reply."""
    engine = engine_for(LLMConfig.model_validate(config))
    assert engine.name == "vllm", engine.name
    loop.run_until_complete(asyncio.to_thread(engine.load))
    try:
        yield engine
    finally:
        loop.run_until_complete(engine.close())
        gc.collect()  # vLLM's left ZeroMQ context goes now, under the module's warning filters
