"""Starting and stopping vLLM's async engine in a model's replica, for both vLLM engines
(``vllm.py``'s text engine and ``vllm_pooling.py``'s): the KV cache's default on a CPU,
vLLM's series on ``/-/metrics``, the replica's placement group for Ray's executor, and a
stop that ends the engine's replies and its output handler first."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING

from app_toolkit import metrics

from . import prometheus_series

if TYPE_CHECKING:
    from vllm import AsyncEngineArgs
    from vllm.config import VllmConfig
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

#: The KV cache a vLLM replica on a CPU takes where nothing says (bytes): vLLM's own default
#: there is most of the machine's memory, so that two engines cannot start on one node.
CPU_KV_CACHE_BYTES = 2 << 30
#: The variable vLLM's CPU build reads its KV cache's size from (GiB).
CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"


#: The name vLLM's Prometheus series are read under (``metrics.add_source``).
METRICS_SOURCE = "vllm"

#: How long a closing engine waits for vLLM's output handler to end once cancelled.
OUTPUT_HANDLER_END_S = 5.0


def kv_cache_sized(arguments: Mapping[str, object]) -> bool:
    """Whether the user sized vLLM's KV cache (an argument, or vLLM's CPU variable)."""
    return (
        arguments.get("kv_cache_memory_bytes") is not None
        or arguments.get("gpu_memory_utilization") is not None
        or bool(os.environ.get(CPU_KV_CACHE_ENV))
    )


def kv_cache_said(arguments: Mapping[str, object]) -> str:
    """The KV cache's size as the start-up log gives it."""
    size = arguments.get("kv_cache_memory_bytes")
    if isinstance(size, int | float):
        return f"{int(size) / 2**30:.2f} GiB"
    if os.environ.get(CPU_KV_CACHE_ENV):
        return f"{os.environ[CPU_KV_CACHE_ENV]} GiB ({CPU_KV_CACHE_ENV})"
    return "vLLM's default"


def sized(arguments: Mapping[str, object]) -> dict[str, object]:
    """vLLM's engine arguments with this toolkit's defaults: on a CPU, a KV cache of
    :data:`CPU_KV_CACHE_BYTES` unless sized; no log line per request unless asked."""
    from vllm.platforms import current_platform

    given = dict(arguments)
    if current_platform.is_cpu() and not kv_cache_sized(given):
        given["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    given.setdefault("enable_log_requests", False)
    return given


async def abort_and_stop(
    llm: AsyncLLM | None, request_ids: Collection[str], stop: Callable[[], None]
) -> None:
    """End ``llm``'s output handler (vLLM then takes no new request), abort ``request_ids``
    (their streams end at once), then call ``stop``, which shuts the engine down, in a
    thread (vLLM's shutdown waits for its processes). Whatever stream is still open then
    (one that got past vLLM's check before the handler ended and into it after the abort,
    or any, if the abort or the stop failed) ends with vLLM's engine-dead error, as vLLM's
    own handler ends every stream when it fails."""
    if llm is None:
        await asyncio.to_thread(stop)
        return
    replies_loop = await _end_output_handler(llm)
    try:
        if request_ids:
            await _on(replies_loop, llm.abort(list(request_ids)))
    finally:
        try:
            await asyncio.to_thread(stop)
        finally:
            _end_open_streams(llm, replies_loop)


async def _end_output_handler(llm: AsyncLLM) -> asyncio.AbstractEventLoop:
    """vLLM's shutdown stops its engine core before it cancels its output handler (a task
    on the loop of the engine's first reply), which meanwhile fails on the stopped core and
    logs "AsyncLLM output_handler failed" with a traceback at every stop. Cancelled first,
    here, it ends quietly. Returns the loop the replies' streams are read on."""
    running = asyncio.get_running_loop()
    handler: asyncio.Task[None] | None = getattr(llm, "output_handler", None)
    if handler is None:
        return running  # never started: no reply was ever read
    if handler.get_loop() is not running:
        return handler.get_loop()  # not ours to wait for: vLLM's shutdown cancels it
    if handler.done():
        return running
    handler.cancel()
    _, pending = await asyncio.wait({handler}, timeout=OUTPUT_HANDLER_END_S)
    if pending:
        logger.warning(
            "vLLM's output handler did not end within %.0f s of its cancellation; stopping the engine anyway",
            OUTPUT_HANDLER_END_S,
        )
    return running


def _end_open_streams(llm: AsyncLLM, replies_loop: asyncio.AbstractEventLoop) -> None:
    """Every stream of ``llm`` still open gets vLLM's engine-dead error, on the loop its
    reader waits on (a stream's wake-up is not thread-safe); none if that loop is closed."""
    from vllm.v1.engine.exceptions import EngineDeadError

    def fail() -> None:
        llm.output_processor.propagate_error(EngineDeadError())

    if replies_loop is asyncio.get_running_loop():
        fail()
        return
    try:
        replies_loop.call_soon_threadsafe(fail)
    except RuntimeError:  # that loop is closed: nothing reads those streams any more
        pass


async def _on(loop: asyncio.AbstractEventLoop, step: Coroutine[object, object, None]) -> None:
    """``step`` run on ``loop`` (vLLM's request states belong to the loop its replies are
    read on), waited for up to :data:`OUTPUT_HANDLER_END_S` when that loop is another's;
    dropped if that loop is closed."""
    if loop is asyncio.get_running_loop():
        await step
        return
    try:
        done = asyncio.run_coroutine_threadsafe(step, loop)
    except RuntimeError:  # closed
        step.close()
        return
    try:
        await asyncio.wait_for(asyncio.wrap_future(done), OUTPUT_HANDLER_END_S)
    except TimeoutError:
        logger.warning("vLLM's abort on its replies' loop did not end within %.0f s", OUTPUT_HANDLER_END_S)


def start_engine(
    engine_args: AsyncEngineArgs, stat_loggers: Sequence[object] = ()
) -> tuple[AsyncLLM, VllmConfig]:
    """vLLM's ``AsyncLLM`` on ``engine_args`` (its engine core a process of its own), and its
    config; vLLM's own series (``vllm:*``) go on ``/-/metrics``. With Ray's executor, vLLM's
    workers go in the replica's placement group, as Ray Serve LLM's do: the engine core
    cannot find the group itself."""
    from vllm.v1.engine.async_llm import AsyncLLM

    config = engine_args.create_engine_config()
    if config.parallel_config.distributed_executor_backend == "ray":
        import ray

        config.parallel_config.placement_group = ray.util.get_current_placement_group()
    llm = AsyncLLM.from_vllm_config(
        config,
        stat_loggers=list(stat_loggers) or None,
        enable_log_requests=bool(engine_args.enable_log_requests),
        disable_log_stats=engine_args.disable_log_stats,
    )
    metrics.add_source(METRICS_SOURCE, prometheus_series.series("vllm:"))
    return llm, config
