"""The engines an LLM deployment can run, chosen by name (``"vllm"``, ``"transformers"``,
``"echo"``, ``"embeddings"``, ``"vllm-pooling"``); each is imported only when chosen, so
that choosing the echo engine imports no torch, and no engine but vLLM's imports vLLM."""

from __future__ import annotations

from typing import Any, Literal, overload

from ..engine import EmbeddingEngine, TextEngine

#: The names :func:`make_engine` takes.
ENGINE_NAMES = ("vllm", "transformers", "echo", "embeddings", "vllm-pooling")


@overload
def make_engine(name: Literal["vllm", "transformers", "echo"], **options: Any) -> TextEngine: ...


@overload
def make_engine(name: Literal["embeddings", "vllm-pooling"], **options: Any) -> EmbeddingEngine: ...


@overload
def make_engine(name: str, **options: Any) -> TextEngine | EmbeddingEngine: ...


def make_engine(name: str, **options: Any) -> TextEngine | EmbeddingEngine:
    """The engine ``name`` names, constructed with ``options`` (not loaded yet: call its
    ``load()`` in the replica).

    - ``"vllm"``: :class:`~.vllm.VLLMEngine` (vLLM's async engine; needs ``vllm`` installed);
    - ``"transformers"``: :class:`~.transformers.TransformersEngine` (a causal LM read by
      transformers, continuous batching);
    - ``"echo"``: :class:`~.echo.EchoEngine` (no model; repeats the prompt);
    - ``"embeddings"``: :class:`~.embeddings.SentenceEngine` (sentence embeddings);
    - ``"vllm-pooling"``: :class:`~.vllm_pooling.VLLMPoolingEngine` (embeddings on vLLM's
      pooling runner; needs ``vllm`` installed).
    """
    if name == "echo":
        from .echo import EchoEngine

        return EchoEngine(**options)
    if name == "vllm":
        from .vllm import VLLMEngine

        return VLLMEngine(**options)
    if name == "transformers":
        from .transformers import TransformersEngine

        return TransformersEngine(**options)
    if name == "embeddings":
        from .embeddings import SentenceEngine

        return SentenceEngine(**options)
    if name == "vllm-pooling":
        from .vllm_pooling import VLLMPoolingEngine

        return VLLMPoolingEngine(**options)
    raise ValueError(f"Unknown engine {name!r}: choose one of {', '.join(ENGINE_NAMES)}")
