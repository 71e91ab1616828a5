"""The transformers engine's LoRA adapters (:class:`~app_toolkit.llm.engine.Adapters`):
read from its adapters' folder beside the forward passes, attached to its decoder between
two of them, detached once no reply uses them."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from pathlib import Path

from ..engine import EngineStopped
from . import adapters
from .decoder import Decoder

logger = logging.getLogger(__name__)


class FolderAdapters:
    """The adapters of ``folder`` (one subfolder each, ``adapters.py``), of rank at most
    ``max_rank``, for the decoder ``decoder()`` gives once the model is loaded."""

    def __init__(self, folder: Path, max_rank: int, decoder: Callable[[], Decoder | None]) -> None:
        self.folder = folder
        self._max_rank = max_rank
        self._decoder = decoder
        #: How long each adapter's attaching held the passes up (s), the newest last.
        self.stalls: collections.deque[float] = collections.deque(maxlen=100)

    def ids(self) -> list[str]:
        return adapters.adapter_ids(self.folder)

    def holds(self, adapter_id: str) -> bool:
        return adapters.holds(self.folder, adapter_id)

    async def load(self, adapter_id: str) -> None:
        """Read ``adapter_id`` in a worker thread, beside the passes, and attach it between
        two passes (the replies decoding wait that long, logged)."""
        decoder = self._loaded()
        started = time.monotonic()
        files = await asyncio.to_thread(adapters.read, self.folder, adapter_id, self._max_rank)
        read = time.monotonic()
        stalled = await decoder.attach(files)
        self.stalls.append(stalled)
        logger.info(
            "Loaded adapter %r (rank %d) in %.3f s: read in %.3f s beside the passes, attached "
            "between two passes in %.4f s (the replies decoding waited that long)",
            adapter_id,
            files.rank,
            time.monotonic() - started,
            read - started,
            stalled,
        )

    def hold(self, adapter_id: str) -> None:
        self._loaded().hold(adapter_id)

    def release(self, adapter_id: str) -> None:
        decoder = self._decoder()
        if decoder is not None:
            decoder.release(adapter_id)

    def unload(self, adapter_id: str) -> None:
        decoder = self._decoder()
        if decoder is not None:
            decoder.detach(adapter_id)

    def _loaded(self) -> Decoder:
        decoder = self._decoder()
        if decoder is None:  # the engine has closed (or never loaded: the server loads it first)
            raise EngineStopped("The engine is not running: it has stopped, or was never loaded")
        return decoder
