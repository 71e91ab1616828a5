"""An engine of this toolkit on vLLM, loaded in the test's process for a module's tests."""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import zmq

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
        # vLLM leaves its ZeroMQ context to the collector, which warns of it whenever it
        # runs: here, not in a later module's test, where the warning is an error.
        failures = _Records()
        logging.getLogger("vllm").addHandler(failures)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Unclosed context", ResourceWarning)
                loop.run_until_complete(engine.close())
                _settle(loop)
        finally:
            logging.getLogger("vllm").removeHandler(failures)
        assert not failures.records, [record.getMessage() for record in failures.records]
        held = [o for o in gc.get_objects() if issubclass(type(o), zmq.Context) and not o.closed]
        assert not held, f"vLLM's ZeroMQ contexts outlive its engine: {held}"


class _Records(logging.Handler):
    """The errors vLLM logs while its engine closes (a traceback kept in one would keep the
    engine's objects alive past the test)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _settle(loop: asyncio.AbstractEventLoop) -> None:
    """Let the tasks vLLM's shutdown cancelled on ``loop`` end and its sockets close (its
    shutdown thread closes them through ``loop``), then collect what they held."""
    loop.run_until_complete(asyncio.sleep(0))
    pending = asyncio.all_tasks(loop)
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=30))
    gc.collect()
