"""An engine of this toolkit on vLLM, loaded in the test's process for a module's tests."""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from typing import Any

import zmq

from app_toolkit.llm import LLMConfig
from app_toolkit.llm.engine import EmbeddingEngine, EngineRequest, EngineStopped, Sampling, TextEngine, Token
from app_toolkit.llm.replica.loading import engine_for

#: How long a reply open when its engine closes may take to end.
ENDED_S = 10.0


@contextmanager
def loaded(loop: asyncio.AbstractEventLoop, config: dict[str, Any]) -> Iterator[TextEngine | EmbeddingEngine]:
    """The engine ``config`` names, loaded as a replica loads it (off ``loop``), then
    closed on ``loop``: vLLM's output handler runs on the loop of its first reply. Unless
    the body raised (a module fixture's body does not see its tests fail: the checks run
    after failed tests too), the close must end a reply still open, log no error, and
    leave nothing of vLLM behind (its ZeroMQ contexts)."""
    engine = engine_for(LLMConfig.model_validate(config))
    assert engine.name == "vllm", engine.name
    loop.run_until_complete(asyncio.to_thread(engine.load))
    try:
        yield engine
        reply = _an_open_reply(loop, engine) if engine.task == "generate" else None
        embedding = _an_open_embedding(loop, engine) if engine.task == "embed" else None
    except BaseException:
        _closed(loop, engine)
        raise
    failures = _Records()
    logging.getLogger("vllm").addHandler(failures)
    try:
        with _unclosed_contexts_ignored():  # the reply's last reference may hold the context
            _closed(loop, engine)
            if reply is not None:  # it ends at the close, stopped, not run to its 500 tokens
                assert loop.run_until_complete(asyncio.wait_for(_rest(reply), ENDED_S)) < 500
                del reply
                gc.collect()
            if embedding is not None:  # it ends at the close, stopped: no empty vectors
                done, _ = loop.run_until_complete(asyncio.wait({embedding}, timeout=ENDED_S))
                assert done, f"an embedding in flight did not end within {ENDED_S:.0f} s of the close"
                assert isinstance(embedding.exception(), EngineStopped), embedding
                del embedding, done  # its error's frames hold the engine
                gc.collect()
    finally:
        logging.getLogger("vllm").removeHandler(failures)
    assert not failures.records, [record.getMessage() for record in failures.records]
    held = [o for o in gc.get_objects() if issubclass(type(o), zmq.Context) and not o.closed]
    assert not held, f"vLLM's ZeroMQ contexts outlive its engine: {held}"


def _closed(loop: asyncio.AbstractEventLoop, engine: TextEngine | EmbeddingEngine) -> None:
    """``engine`` closed, and what vLLM left on ``loop`` ended and collected."""
    with _unclosed_contexts_ignored():
        loop.run_until_complete(engine.close())
        # The tasks vLLM's shutdown cancelled, and its sockets' closing (its shutdown thread
        # closes them through the loop), end now.
        loop.run_until_complete(asyncio.sleep(0))
        pending = asyncio.all_tasks(loop)
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=30))
        assert not [task for task in pending if not task.done()], pending
        gc.collect()


@contextmanager
def _unclosed_contexts_ignored() -> Iterator[None]:
    """vLLM leaves its ZeroMQ context to be freed, which warns of it whenever that comes:
    while its engine closes, not in a later module's test, where the warning is an error."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Unclosed context", ResourceWarning)
        yield


def _an_open_reply(loop: asyncio.AbstractEventLoop, engine: TextEngine) -> AsyncGenerator[Token, None]:
    """A reply of 500 tokens, its first read: still open when the engine closes."""
    request = EngineRequest(engine.encode("Count to one hundred:"), Sampling(max_tokens=500, ignore_eos=True))
    reply = engine.generate(request)
    assert isinstance(reply, AsyncGenerator)
    loop.run_until_complete(anext(reply))
    return reply


def _an_open_embedding(
    loop: asyncio.AbstractEventLoop, engine: EmbeddingEngine
) -> asyncio.Task[list[list[float]]]:
    """64 inputs of 250 tokens each, submitted to vLLM: still in flight when the engine
    closes."""
    inputs = [[engine.encode("word", add_special_tokens=False)[0]] * 250 for _ in range(64)]
    embedding = loop.create_task(engine.embed(inputs))
    loop.run_until_complete(asyncio.sleep(0.05))  # the requests reach vLLM's engine
    assert not embedding.done(), "the embeddings ended before the close: make them larger"
    return embedding


async def _rest(reply: AsyncGenerator[Token, None]) -> int:
    """The tokens a reply gives before it ends with EngineStopped (its engine closed)."""
    count = 1
    try:
        async for _ in reply:
            count += 1
    except EngineStopped:
        return count
    raise AssertionError(f"a reply open at the close ended after {count} tokens without EngineStopped")


class _Records(logging.Handler):
    """The errors vLLM logs while its engine closes (a traceback kept in one would keep the
    engine's objects alive past the test)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
