"""The engines an LLM deployment can run, chosen by name (``"transformers"``, ``"echo"``,
``"embeddings"``); each is imported only when chosen, so that choosing the echo engine
imports no torch."""

from __future__ import annotations

from typing import Any, Literal, overload

from ..engine import EmbeddingEngine, TextEngine

#: The names :func:`make_engine` takes.
ENGINE_NAMES = ("transformers", "echo", "embeddings")


@overload
def make_engine(name: Literal["transformers", "echo"], **options: Any) -> TextEngine: ...


@overload
def make_engine(name: Literal["embeddings"], **options: Any) -> EmbeddingEngine: ...


@overload
def make_engine(name: str, **options: Any) -> TextEngine | EmbeddingEngine: ...


def make_engine(name: str, **options: Any) -> TextEngine | EmbeddingEngine:
    """The engine ``name`` names, constructed with ``options`` (not loaded yet: call its
    ``load()`` in the replica).

    - ``"transformers"``: :class:`~.transformers.TransformersEngine` (a causal LM read by
      transformers, continuous batching);
    - ``"echo"``: :class:`~.echo.EchoEngine` (no model; repeats the prompt);
    - ``"embeddings"``: :class:`~.embeddings.SentenceEngine` (sentence embeddings).
    """
    if name == "echo":
        from .echo import EchoEngine

        return EchoEngine(**options)
    if name == "transformers":
        from .transformers import TransformersEngine

        return TransformersEngine(**options)
    if name == "embeddings":
        from .embeddings import SentenceEngine

        return SentenceEngine(**options)
    raise ValueError(f"Unknown engine {name!r}: choose one of {', '.join(ENGINE_NAMES)}")
