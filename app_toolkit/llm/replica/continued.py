"""A reply continued after its model replica was lost: ``LLMServer.generate`` is
``@continuable``, and this is its ``continue_from``. The ingress kept the pieces it got;
their token ids (``Delta.tokens``) are the reply so far, per choice. The replica that
continues reads them through the same detokenizer, stop strings, grammar and tool-call
shaping (``ReplyStream``), sends nothing of them again, and produces the rest."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from app_toolkit.llm.events import Continued, Delta, Generation


def continue_generation(generation: Generation, produced: Sequence[object]) -> Generation:
    """``generation`` to continue after the pieces ``produced`` (the prompt's count first,
    then each choice's pieces): each choice's tokens so far, or None where it finished."""
    count = max(1, len(generation.prompts)) * generation.n
    tokens: list[list[int] | None] = [[] for _ in range(count)]
    for piece in produced:
        if not isinstance(piece, Delta) or not 0 <= piece.index < count:
            raise TypeError(f"A reply continues from its pieces (Deltas of {count} choices); got {piece!r}")
        kept = tokens[piece.index]
        if kept is None:
            continue
        if piece.finish_reason is not None:
            tokens[piece.index] = None
        else:
            kept.extend(piece.tokens)
    continued = Continued(tuple(None if kept is None else tuple(kept) for kept in tokens))
    return dataclasses.replace(generation, continued=continued)
