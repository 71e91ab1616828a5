"""Choosing one reply's next token from the model's scores, in vLLM's order (its
``v1/sample/sampler.py``): the tokens a constraint allows, ``logit_bias`` and
``min_tokens``, the three penalties, then greedy or tempered sampling cut by ``min_p``,
``top_k`` and ``top_p``, with the reply's own random numbers when it has a seed. Each
function takes one row of scores (the logits of one reply) and changes it in place."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from ..engine import Constraint, Logprobs, Sampling


def bias(row: torch.Tensor, sampling: Sampling) -> None:
    """Add ``sampling.logit_bias`` to its tokens' scores."""
    if not sampling.logit_bias:
        return
    width = row.shape[-1]
    tokens = torch.tensor([token for token, _ in sampling.logit_bias], dtype=torch.long)
    amounts = torch.tensor([amount for _, amount in sampling.logit_bias], dtype=row.dtype)
    inside = tokens < width  # a padded vocabulary is wider than the tokenizer's, never narrower
    row.index_add_(0, tokens[inside], amounts[inside])


def hold_stops(row: torch.Tensor, sampling: Sampling, generated: int, stops: Collection[int]) -> None:
    """Refuse the ``stops`` (the end-of-sequence and stop tokens) while the reply has fewer
    than ``min_tokens`` tokens; as vLLM does, not where that would leave no token at all
    (a grammar that allows only a stop token)."""
    if generated >= sampling.min_tokens or not stops:
        return
    width = row.shape[-1]
    index = torch.tensor([token for token in stops if token < width], dtype=torch.long)
    held = torch.zeros(width, dtype=torch.bool)
    held[index] = True
    if bool(torch.isfinite(row[~held]).any()):
        row[index] = float("-inf")


def penalise(row: torch.Tensor, sampling: Sampling, seen: Collection[int], reply: Sequence[int]) -> None:
    """The penalties, as vLLM applies them: ``repetition_penalty`` on the tokens ``seen``
    (the prompt's and the reply's: a positive score divided, a negative one multiplied),
    then ``frequency_penalty`` times each token's count in the ``reply``, and
    ``presence_penalty`` once for each token it holds, subtracted."""
    penalty = sampling.repetition_penalty
    if penalty != 1.0 and seen:
        index = torch.tensor(sorted(seen), dtype=torch.long)
        scores = row[index]
        row[index] = torch.where(scores > 0, scores / penalty, scores * penalty)
    if reply and (sampling.frequency_penalty or sampling.presence_penalty):
        counts = torch.bincount(torch.tensor(reply, dtype=torch.long), minlength=row.shape[-1])
        counts = counts[: row.shape[-1]].to(row.dtype)
        row -= sampling.frequency_penalty * counts + sampling.presence_penalty * (counts > 0).to(row.dtype)


#: A constrained row whose constraint allows no token: its reply ends.
NOTHING_ALLOWED = -1
#: The lowest temperature that samples (vLLM's): one below it, but above 0, is taken as it.
MIN_TEMPERATURE = 0.01


def allowed_mask(row: torch.Tensor, constraint: Constraint) -> torch.Tensor:
    """The tokens ``constraint`` allows next, as a mask of the row's width: the model's
    vocabulary may be wider than the tokenizer's (padded for speed), and a shorter mask
    refuses the rest."""
    width = row.shape[-1]
    allowed = torch.as_tensor(constraint.allowed(width), dtype=torch.bool).flatten()[:width]
    if allowed.shape[0] < width:
        allowed = torch.cat([allowed, torch.zeros(width - allowed.shape[0], dtype=torch.bool)])
    return allowed


def choose(row: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The highest-scoring token when greedy (temperature 0); else one drawn from the
    tempered distribution (a temperature below vLLM's 0.01 taken as 0.01) less the tokens
    below ``min_p`` times the likeliest one, outside the ``top_k`` likeliest, and outside
    the smallest set whose mass reaches ``top_p`` (``generator``: a seeded reply's). A score
    that is not a number counts as refused."""
    row = torch.nan_to_num(row, nan=float("-inf"))
    if sampling.greedy:
        return int(row.argmax())
    scores = row / max(sampling.temperature, MIN_TEMPERATURE)
    if sampling.min_p > 0:
        probabilities = torch.softmax(scores, dim=-1)
        scores.masked_fill_(probabilities < sampling.min_p * probabilities.max(), float("-inf"))
    if 0 < sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores.masked_fill_(scores < kth, float("-inf"))
    probabilities = torch.nan_to_num(torch.softmax(scores, dim=-1))
    if not bool(probabilities.any()):
        return int(row.argmax())  # no token has any mass (scores of +inf): the likeliest
    if sampling.top_p < 1.0:
        ordered, order = probabilities.sort(descending=True)
        ordered[ordered.cumsum(0) - ordered > sampling.top_p] = 0  # keep the smallest set reaching top_p
        return int(order[torch.multinomial(ordered, 1, generator=generator)])
    return int(torch.multinomial(probabilities, 1, generator=generator))


def skip_draws(generator: torch.Generator, width: int, count: int) -> None:
    """Move a seeded reply's random numbers past ``count`` tokens drawn from rows of
    ``width`` as :func:`choose` draws them (a draw takes as many numbers whatever the
    scores), so a reply continued from its tokens so far draws its next one as the
    unbroken reply would have."""
    even = torch.ones(width)
    for _ in range(count):
        torch.multinomial(even, 1, generator=generator)


def logprobs_of(log_probabilities: torch.Tensor, token: int, count: int) -> Logprobs:
    """``token``'s log-probability and the ``count`` likeliest tokens' (likeliest first),
    from a row's log-softmax (taken before the row was changed: vLLM's raw logprobs)."""
    count = min(count, log_probabilities.shape[-1])
    top = torch.topk(log_probabilities, count) if count else None
    likeliest = () if top is None else tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True))
    return Logprobs(float(log_probabilities[token]), likeliest)
