"""vLLM's pooling runner in the model's replica: an embedding model (``engine_kwargs.runner:
pooling``) on ``llm_engine: vLLM`` where the ``vllm`` module imports.

vLLM reads the model's folder as it reads it for ``vllm serve --runner pooling`` (a
sentence-transformers folder: its pooling and normalisation from ``modules.json``); the
server sends token ids and gets one vector per input, normalised (vLLM's
``use_activation``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..engine import EngineFailed, EngineStopped
from .hf_tokenizer import TokenizerText
from .vllm_start import abort_and_stop, kv_cache_said, sized, start_engine

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)


class VLLMPoolingEngine(TokenizerText):
    """Embeddings from vLLM's ``AsyncLLM`` on its pooling runner, batched by its scheduler.

    Args:
        path: The model's folder (a Hugging Face or sentence-transformers checkpoint).
        model_id: The name clients use (vLLM's ``served_model_name``).
        arguments: vLLM's engine arguments (``AsyncEngineArgs``' fields), less ``model``
            and ``runner``.
        tokenizer_path: The tokenizer's folder (``tokenizer_source``); None: the model's.
    """

    #: The engine's name, as the start-up log and ``/v1/models`` give it.
    name = "vllm"
    task: Literal["embed"] = "embed"

    def __init__(
        self,
        path: str | os.PathLike[str],
        model_id: str,
        arguments: dict[str, object],
        tokenizer_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.path = Path(path)
        self._model_id = model_id
        self._arguments = {key: value for key, value in arguments.items() if key not in ("runner", "task")}
        self._tokenizer_path = None if tokenizer_path is None else Path(tokenizer_path)
        self.context_window = 0  # the model's, once loaded
        self.dimensions = 0  # known once loaded
        self._llm: AsyncLLM | None = None
        self._closed = False
        self._requests: set[str] = set()  # vLLM's ids of the inputs in it

    def load(self) -> None:
        """Start vLLM's engine on the model (its engine core runs in a process of its own);
        what a failed start made is undone."""
        started = time.monotonic()
        from transformers import AutoTokenizer
        from vllm import AsyncEngineArgs

        arguments = sized(self._arguments)
        tokenizer = self._tokenizer_path or self.path
        engine_args = AsyncEngineArgs(
            model=str(self.path),
            tokenizer=str(tokenizer),
            served_model_name=[self._model_id],
            runner="pooling",
            **arguments,
        )
        try:
            self._llm, config = start_engine(engine_args)
            self.context_window = int(config.model_config.max_model_len)
            self.dimensions = int(config.model_config.embedding_size)
            self.tokenizer = AutoTokenizer.from_pretrained(
                tokenizer, local_files_only=True, trust_remote_code=bool(arguments.get("trust_remote_code"))
            )
        except BaseException:
            self._stop()
            raise
        logger.info(
            "vLLM serves %s on its pooling runner in %.1f s: max_model_len %d, %d dimensions, KV cache %s",
            self.path,
            time.monotonic() - started,
            self.context_window,
            self.dimensions,
            kv_cache_said(arguments),
        )

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One vector of length ``dimensions`` and norm 1 per input, in order: token ids
        read as they are (a text's, with its special tokens, from :meth:`encode`). Raises
        :class:`EngineStopped` when vLLM's engine stops first (it aborts one, or its engine
        core is dead), :class:`EngineFailed` when vLLM ends one unfinished otherwise."""
        from vllm import PoolingParams
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self._loaded()

        async def one(tokens: list[int]) -> list[float]:
            request_id = uuid.uuid4().hex
            self._requests.add(request_id)
            pooling = PoolingParams(task="embed", use_activation=True)  # one vector, normalised
            outputs = llm.encode(TokensPrompt(prompt_token_ids=tokens), pooling, request_id)
            vector: list[float] = []
            finished = False
            try:
                async for output in outputs:
                    vector = [float(value) for value in output.outputs.data.tolist()]
                    finished = output.finished
            except EngineDeadError as exc:  # the engine closed around the request
                raise EngineStopped("vLLM's engine stopped before the embedding was complete") from exc
            finally:
                self._requests.discard(request_id)
                await outputs.aclose()  # aborts the request in vLLM if it is still running
            if not (finished and vector):  # vLLM's final output of an aborted request is empty
                if self._closed:  # close() aborted it
                    raise EngineStopped("vLLM's engine stopped before the embedding was complete: aborted")
                raise EngineFailed("vLLM ended the embedding before it was complete")
            return vector

        # One request per input, batched by vLLM's scheduler; one that fails cancels the rest
        # and its error is raised (outside the handler: raised in it, the error and the
        # group would hold each other, and the engine's frames, until a collection).
        first: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(list(tokens))) for tokens in inputs]
        except ExceptionGroup as failed:
            first = failed.exceptions[0]
        if first is not None:
            raise first
        return [task.result() for task in tasks]

    async def check_health(self) -> None:
        """Raise vLLM's EngineDeadError once its engine core has died: the replica is then
        replaced."""
        if self._closed or self._llm is None:  # not EngineStopped: the replica is not gone
            raise RuntimeError("The engine is not running")
        await self._llm.check_health()

    async def close(self) -> None:
        """Abort the inputs in vLLM, and stop its engine (its processes end). The embeddings
        still open end with :class:`EngineStopped`."""
        self._closed = True
        await abort_and_stop(self._llm, self._requests, self._stop)

    def _stop(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    def _loaded(self) -> AsyncLLM:
        if self._closed:
            raise EngineStopped("The engine has stopped: it takes no more requests")
        if self._llm is None:
            raise RuntimeError("The engine is not loaded: call load() first (once per replica)")
        return self._llm
