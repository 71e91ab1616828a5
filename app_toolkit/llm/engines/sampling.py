"""Choosing one reply's next token from the model's scores: the repetition penalty, the
tokens a constraint allows, then greedy or tempered top-p sampling with the reply's own
random numbers when it has a seed. Each function takes one row of scores (the logits of
one reply) and changes it in place."""

from __future__ import annotations

from collections.abc import Collection

import torch

from ..engine import Constraint, Sampling


def penalise(row: torch.Tensor, seen: Collection[int], penalty: float) -> None:
    """Make the ``seen`` tokens less likely by ``penalty`` (1: no change), as transformers'
    and vLLM's ``repetition_penalty`` does: positive scores divided, negative multiplied."""
    if penalty == 1.0 or not seen:
        return
    index = torch.tensor(sorted(seen))
    scores = row[index]
    row[index] = torch.where(scores > 0, scores / penalty, scores * penalty)


#: A constrained row whose constraint allows no token: its reply ends.
NOTHING_ALLOWED = -1


def restrict(row: torch.Tensor, constraint: Constraint) -> bool:
    """Set the scores of the tokens ``constraint`` refuses to -inf, in place; False if it
    allows none. The model's vocabulary may be wider than the tokenizer's (padded for
    speed): the constraint is asked for the row's width, and a shorter mask refuses the
    rest."""
    width = row.shape[-1]
    allowed = torch.as_tensor(constraint.allowed(width), dtype=torch.bool).flatten()[:width]
    if allowed.shape[0] < width:
        allowed = torch.cat([allowed, torch.zeros(width - allowed.shape[0], dtype=torch.bool)])
    if not bool(allowed.any()):
        return False
    row.masked_fill_(~allowed, float("-inf"))
    return True


def choose(row: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The highest-scoring token at temperature 0; else one drawn from the tempered
    distribution cut to the smallest set above ``top_p`` (``generator``: a seeded reply's)."""
    if sampling.temperature <= 0:
        return int(row.argmax())
    probabilities = torch.softmax(row / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        ordered, order = probabilities.sort(descending=True)
        ordered[ordered.cumsum(0) - ordered > sampling.top_p] = 0  # keep the smallest set above top_p
        return int(order[torch.multinomial(ordered, 1, generator=generator)])
    return int(torch.multinomial(probabilities, 1, generator=generator))
