"""The vLLM engine's LoRA adapters (:class:`~app_toolkit.llm.engine.Adapters`): each read
from its adapters' folder by vLLM itself (a ``LoRARequest``), which applies it in its own
batches (``enable_lora``); removed from vLLM once evicted and no reply uses it."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from . import adapters
from .adapters import AdapterNotFound, AdapterRefused

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)


class VLLMAdapters:
    """The adapters of ``folder`` (one subfolder each, as ``adapters.py`` finds them), for
    the ``AsyncLLM`` that ``llm()`` gives once the engine is loaded."""

    def __init__(self, folder: Path, llm: Callable[[], AsyncLLM]) -> None:
        self.folder = folder
        self._llm = llm
        self._loaded: dict[str, LoRARequest] = {}
        self._held: collections.Counter[str] = collections.Counter()
        self._evicted: set[str] = set()  # unloaded while a reply held it: removed on release
        self._next_id = 1  # vLLM's adapter ids are positive integers
        self._removing: set[asyncio.Task[object]] = set()
        self._closed = False

    def ids(self) -> list[str]:
        return adapters.adapter_ids(self.folder)

    def holds(self, adapter_id: str) -> bool:
        return adapters.holds(self.folder, adapter_id)

    async def load(self, adapter_id: str) -> None:
        """Have vLLM read ``adapter_id`` (its checks: a LoRA adapter of this model, its rank
        within ``max_lora_rank``); AdapterRefused with vLLM's reason when it does not."""
        from vllm.lora.request import LoRARequest

        if not self.holds(adapter_id):
            raise AdapterNotFound(adapter_id)
        self._evicted.discard(adapter_id)
        if adapter_id in self._loaded:
            return
        started = time.monotonic()
        request = LoRARequest(adapter_id, self._next_id, str(self.folder / adapter_id))
        self._next_id += 1
        llm = self._llm()
        try:
            await llm.add_lora(request)
        except Exception as exc:  # vLLM raises its engine core's refusals as Exception
            if llm.errored:  # no refusal: the engine is dead (its health check says so)
                raise
            raise AdapterRefused(f"vLLM refused adapter {adapter_id!r}: {exc}") from None
        self._loaded[adapter_id] = request
        logger.info("vLLM loaded adapter %r in %.3f s", adapter_id, time.monotonic() - started)

    def request(self, adapter_id: str) -> LoRARequest:
        """The ``LoRARequest`` a reply with ``adapter_id`` (loaded) sends."""
        loaded = self._loaded.get(adapter_id)
        if loaded is None:
            raise ValueError(f"adapter {adapter_id!r} is not loaded: load it first")
        return loaded

    def hold(self, adapter_id: str) -> None:
        """A reply will use ``adapter_id`` (held before it loads: the server holds it, then
        waits for the load)."""
        self._held[adapter_id] += 1

    def release(self, adapter_id: str) -> None:
        self._held[adapter_id] -= 1
        if self._held[adapter_id] <= 0:
            del self._held[adapter_id]
            if adapter_id in self._evicted:
                self._remove(adapter_id)

    def unload(self, adapter_id: str) -> None:
        if self._held[adapter_id] > 0:
            self._evicted.add(adapter_id)  # removed when its last reply ends
        else:
            self._remove(adapter_id)

    async def aclose(self) -> None:
        """The engine stops: the removals under way end (vLLM forgets every adapter with it)."""
        self._closed = True
        for task in list(self._removing):
            task.cancel()
        await asyncio.gather(*self._removing, return_exceptions=True)

    def _remove(self, adapter_id: str) -> None:
        """Take ``adapter_id`` out of vLLM (a task of its own, owned here: ``unload`` cannot
        wait)."""
        self._evicted.discard(adapter_id)
        request = self._loaded.pop(adapter_id, None)
        if request is None or self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._llm().remove_lora(request.lora_int_id))
        self._removing.add(task)
        task.add_done_callback(self._removed)

    def _removed(self, task: asyncio.Task[object]) -> None:
        self._removing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("vLLM could not remove an adapter: %s", task.exception())
