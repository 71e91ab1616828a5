"""A causal language model read by transformers, on the CPU, behind continuous batching
(``decoder.py``).

The model is a folder (a Hugging Face checkpoint, or one holding a GGUF file named by
``gguf_file``, which transformers de-quantizes: SmolLM2-135M-Instruct takes about 35 s of
a core; the first load keeps the result on disk for the next, ``gguf_cache.py``). Nothing
is downloaded: the folder must hold every file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..engine import Capabilities, EngineLoad, EngineRequest, EngineStopped, Token
from . import gguf_cache
from .decoder import Decoder, DecoderHooks
from .folder_adapters import FolderAdapters
from .hf_tokenizer import TokenizerText, end_of_turn_ids
from .prefix_cache import PrefixCache

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

#: The ``dtype`` values taken (vLLM's names); "auto" keeps the checkpoint's own.
DTYPES = ("auto", *gguf_cache.DTYPES)


class TransformersEngine(TokenizerText):
    """Replies from a transformers causal LM, ``slots`` decoded together.

    Args:
        path: The model's folder.
        gguf_file: The GGUF file's name in ``path``, when the weights are one.
        max_model_len: The longest prompt plus reply, in tokens (at most the model's own
            ``max_position_embeddings``; None: that).
        slots: Replies decoded together (vLLM's ``max_num_seqs``); the rest queue.
        dtype: The weights' type in memory: one of :data:`DTYPES`.
        hooks: What the decoder reports to (queue waits, batch sizes, cancellations).
        prefix_cache_bytes: The most the keys and values of sequences read before may
            take, for prompts that start like them (``prefix_cache.py``); 0: none kept.
        adapters_path: The folder of LoRA adapters (``adapters.py``); None: no adapters.
        max_adapters_in_batch: Most adapters decoded in one batch (0: no limit).
        max_lora_rank: The highest rank of an adapter it loads.
    """

    #: The engine's name, as the start-up log and ``/v1/models`` give it.
    name = "transformers"
    task: Literal["generate"] = "generate"

    def __init__(
        self,
        path: str | os.PathLike[str],
        gguf_file: str | None = None,
        *,
        max_model_len: int | None = None,
        slots: int = 8,
        dtype: str = "auto",
        hooks: DecoderHooks | None = None,
        prefix_cache_bytes: int = 0,
        adapters_path: str | os.PathLike[str] | None = None,
        max_adapters_in_batch: int = 0,
        max_lora_rank: int = 16,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots (max_num_seqs) must be >= 1, got {slots}")
        if max_model_len is not None and max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 (a prompt and a reply), got {max_model_len}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        #: Sequences read before (None: prefix caching off); its counts are the cache's hits.
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.adapters: FolderAdapters | None = (
            None
            if adapters_path is None
            else FolderAdapters(Path(adapters_path), max_lora_rank, lambda: self._decoder)
        )
        self._max_adapters_in_batch = max_adapters_in_batch
        self.capabilities = Capabilities(
            prefix_cache=self.prefix_cache is not None, logprobs=True, structured="masks", continuation="all"
        )
        self.path = Path(path)
        self.gguf_file = gguf_file
        self.slots = slots
        self.context_window = max_model_len or 0  # the model's own limit, once loaded
        self._max_model_len = max_model_len
        self._dtype = dtype
        self._hooks = hooks
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.eos_token_ids: frozenset[int] = frozenset()
        self._decoder: Decoder | None = None
        self._closed = False

    def load(self) -> None:
        """Read the tokenizer and the weights (logged as one line with the time each took)."""
        os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF reader draws a progress bar of its own
        started = time.monotonic()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401 - timed as the imports
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated
        # Warnings about the GGUF conversion are not the user's to act on.
        hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # transformers: unannotated
        if not self.path.is_dir():
            raise FileNotFoundError(f"The model folder {self.path} does not exist: check the model's source")
        if self.gguf_file is not None and not (self.path / self.gguf_file).is_file():
            raise FileNotFoundError(
                f"{self.path} holds no {self.gguf_file}: name a GGUF file that is in the folder"
            )
        files: gguf_cache.FromPretrained = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        if self._dtype != "auto":
            files["dtype"] = getattr(torch, self._dtype)
        gguf = self.path / self.gguf_file if self.gguf_file else None
        copy = gguf_cache.find(gguf, self._dtype) if gguf else None
        imported = time.monotonic()
        if copy is not None:  # de-quantized by an earlier load
            try:
                kept: gguf_cache.FromPretrained = {  # nothing else
                    "dtype": getattr(torch, copy.dtype),
                    "use_safetensors": True,
                }
                tokenizer, model, tokenized = _read(copy.folder, kept)
            except Exception as exc:  # a damaged copy: the file is still there
                if gguf_cache.out_of_memory(exc):
                    raise  # the copy is fine; de-quantizing would need more
                logger.warning(
                    "Could not read the copy of %s in %s (%s): reading the file", gguf, copy.folder, exc
                )
                gguf_cache.discard(copy)
                copy = None
        if copy is None:
            tokenizer, model, tokenized = _read(self.path, files)
        logger.info(
            "Loaded %s in %.1f s (imports %.1f s, tokenizer %.1f s, weights %.1f s)%s",
            self.path / (self.gguf_file or ""),
            time.monotonic() - started,
            imported - started,
            tokenized - imported,
            time.monotonic() - tokenized,
            f", from its de-quantized copy in {copy.folder}" if copy else "",
        )
        if gguf is not None and copy is None:
            gguf_cache.store(gguf, self._dtype, model, tokenizer)
        window = int(model.config.max_position_embeddings)
        self.context_window = min(self._max_model_len or window, window)
        self.tokenizer = tokenizer
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self._decoder = Decoder(
            model,
            self.eos_token_ids,
            self.slots,
            self._hooks,
            self.prefix_cache,
            self._max_adapters_in_batch,
        )

    async def generate(self, request: EngineRequest) -> AsyncGenerator[Token, None]:
        """The tokens of one reply (``TextEngine.generate``); the reply takes at most the
        context window's room after the prompt. ``request.adapter``: a loaded adapter
        (:attr:`adapters`)."""
        decoder = self._loaded_decoder()
        room = self.context_window - len(request.prompt)
        if room < 1:
            raise ValueError(
                f"The prompt takes {len(request.prompt)} tokens; the context window is "
                f"{self.context_window}: shorten the prompt"
            )
        if request.sampling.max_tokens > room:
            fitted = dataclasses.replace(request.sampling, max_tokens=room)
            request = dataclasses.replace(request, sampling=fitted)
        tokens = decoder.generate(request)
        try:
            async for token in tokens:
                yield token
        finally:
            await tokens.aclose()  # the reply leaves the batch now, not when collected

    @property
    def active(self) -> int:
        """Replies decoding, reading their prompt, or queued."""
        return 0 if self._decoder is None else self._decoder.active

    @property
    def tokens(self) -> int:
        """Tokens produced since the start."""
        return 0 if self._decoder is None else self._decoder.tokens

    def current_load(self) -> EngineLoad:
        """What the decoder holds now (``EngineLoad``)."""
        return EngineLoad.of(self.slots, ()) if self._decoder is None else self._decoder.current_load()

    async def check_health(self) -> None:
        """Raise if decoding has stopped for good (its loop ended by a fault)."""
        if self._decoder is not None:
            self._decoder.check_health()

    async def close(self) -> None:
        """Stop decoding (the replies still open end with :class:`EngineStopped`) and let go
        of the model."""
        self._closed = True
        if self._decoder is not None:
            await self._decoder.close()
            self._decoder = None

    def _loaded_decoder(self) -> Decoder:
        if self._closed:
            raise EngineStopped("The engine has stopped: it takes no more requests")
        if self._decoder is None:
            raise RuntimeError("The engine is not loaded: call load() first (once per replica)")
        return self._decoder


def _read(
    source: Path, files: gguf_cache.FromPretrained
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel, float]:
    """The tokenizer and the model (in eval mode) in ``source``, and when the tokenizer
    was read (``files``: ``gguf_file``, ``dtype``, ``use_safetensors``, as transformers
    takes them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = {"gguf_file": files["gguf_file"]} if "gguf_file" in files else {}
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, **gguf)
    tokenized = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, **files)
    model.eval()  # type: ignore[no-untyped-call]  # transformers: unannotated
    return tokenizer, model, tokenized


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The tokens that end a reply: the tokenizer's and the model's end-of-sequence tokens,
    and the chat template's end of turn where the vocabulary has one."""
    found: set[int] = set()
    for configured in (
        tokenizer.eos_token_id,
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        model.config.eos_token_id,
    ):
        if isinstance(configured, int):
            found.add(configured)
        elif isinstance(configured, list | tuple):
            found.update(token for token in configured if isinstance(token, int))
    found.update(end_of_turn_ids(tokenizer))
    return frozenset(found)
