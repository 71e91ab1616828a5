"""The forward passes of a decoder's batch, in the worker thread they run in: a joining
reply's prompt pass (prefill) and the decoding step that gives every row its next token,
each row's token sampled on its own terms.

A prompt is read ``PREFILL_CHUNK`` tokens at a time from the end of its longest cached
prefix (:class:`~.prefix_cache.PrefixCache`), then its keys and values join the batch's
(:class:`~.batch_cache.BatchCache`). A pass checks before each layer whether a reader of
a row it computes left, and stops; a decoding step's cache is cut back to where it was,
so the step can be done again without that row. The keys and values of replies that
ended are kept, and copied into the prefix cache here, in the passes' thread.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, TypeVar

import torch

from ..engine import Constraint, Logprobs, Sampling
from .adapters import AttachedAdapters
from .batch_cache import BatchCache, ForwardOutput, KVCache, cache_argument, cache_from, cache_of
from .prefix_cache import LayerKV, PrefixCache
from .sampling import (
    NOTHING_ALLOWED,
    allowed_mask,
    bias,
    choose,
    hold_stops,
    logprobs_of,
    penalise,
)

#: Prompt tokens read per forward pass (bounds the memory a long prompt's pass takes).
PREFILL_CHUNK = 256


class Row(Protocol):
    """One reply's row, as the passes read and write it (the decoder's sequence;
    ``decoder.py`` imports this module)."""

    prompt: list[int]
    #: What the prompt pass reads: the prompt, then the tokens a continued reply carries.
    context: list[int]
    sampling: Sampling
    constraint: Constraint | None
    generator: torch.Generator | None
    seen: set[int]
    abandoned: bool
    cached: int
    reply: list[int]
    adapter: str
    finished: bool
    logprobs: Logprobs | None
    failure: Exception | None


_R = TypeVar("_R", bound=Row)


def _logits_width(model: torch.nn.Module) -> int:
    """The width of a row of ``model``'s logits: its output layer's, else its vocabulary's."""
    get_output = getattr(model, "get_output_embeddings", None)
    weight = getattr(get_output() if callable(get_output) else None, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    return int(getattr(getattr(model, "config", None), "vocab_size", 0))


class _Abandoned(Exception):
    """Raised between two layers of a forward pass when a reader of a row it computes left."""


class ForwardPasses:
    """The model and the batch's keys and values, and the passes that read them."""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_ids: Collection[int],
        adapters: AttachedAdapters,
        prefix_cache: PrefixCache | None,
    ) -> None:
        self.model = model
        #: The width of a row of logits: what a token is drawn from (``sampling.choose``).
        self.logits_width = _logits_width(model)
        self._cache_argument = cache_argument(model)
        self._eos = frozenset(eos_ids)
        self._adapters = adapters
        self.prefixes = prefix_cache
        self.batch = BatchCache()
        # Ended replies' keys and values (views of the batch's) for the prefix cache.
        self.to_keep: list[tuple[list[int], list[LayerKV], str]] = []
        # A forward pass checks these rows before each layer and stops when one was
        # abandoned, so a cancelled reply frees its place within a layer's time, not a pass's.
        self._watched: Sequence[Row] = []
        layers = getattr(getattr(model, "model", None), "layers", None) or []
        self._layer_hooks = [layer.register_forward_pre_hook(self._stop_if_abandoned) for layer in layers]

    def use(self, model: torch.nn.Module) -> None:
        """Pass through ``model`` from now on (the model, its adapters changed)."""
        self.model = model
        self._cache_argument = cache_argument(model)

    def close(self) -> None:
        for hook in self._layer_hooks:
            hook.remove()
        self._layer_hooks = []

    def ends(self, sequence: Row, token: int) -> bool:
        """``token`` ends the reply (yielded marked ``ends``, never shown): an end of sequence
        (unless ignored) or a stop token."""
        return token in sequence.sampling.stop_token_ids or (
            token in self._eos and not sequence.sampling.ignore_eos
        )

    def _stop_if_abandoned(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        if any(sequence.abandoned for sequence in self._watched):
            raise _Abandoned

    def keep_rows(self, active: Sequence[Row], keep: list[int]) -> None:
        """Only the rows ``keep`` of ``active`` stay in the batch, in order."""
        self._keep_finished(active, [index for index in range(len(active)) if index not in keep])
        self.batch.keep(keep)

    def _keep_finished(self, active: Sequence[Row], rows: list[int]) -> None:
        """Keep the keys and values of the replies in ``rows`` that ended (not those left
        by their readers) in the prefix cache: their prompt and the tokens the batch has
        read of their reply (all but the last sent, or all when a stop token ended it)."""
        if self.prefixes is None:
            return
        for row in rows:
            sequence = active[row]
            if sequence.finished:
                width, layers = self.batch.row(row)  # views: copied in the passes' thread
                self.to_keep.append(((sequence.prompt + sequence.reply)[:width], layers, sequence.adapter))

    def store_kept(self) -> None:
        """Copy the ended replies' keys and values into the prefix cache (in the passes'
        thread: a long sequence's copy takes milliseconds the event loop should not)."""
        kept, self.to_keep = self.to_keep, []
        for tokens, layers, adapter in kept:
            copies = [(keys.clone(), values.clone()) for keys, values in layers]
            assert self.prefixes is not None
            self.prefixes.store(tokens, copies, adapter)

    @torch.inference_mode()
    def prefill(self, joining: Sequence[_R], active: list[_R]) -> list[int | None]:
        """Run each new prompt alone, ``PREFILL_CHUNK`` tokens at a time, from the end of
        its longest cached prefix, then merge its cache into the batch (its row joins
        ``active``). A row abandoned meanwhile (its reader left) stops at the next layer
        and gets None instead of a first token."""
        self.store_kept()
        firsts: list[int | None] = []
        for sequence in joining:
            cache: KVCache | None = None
            output: ForwardOutput | None = None
            cached = 0
            if self.prefixes is not None:
                found = self.prefixes.lookup(sequence.context, sequence.adapter)
                cached = found.tokens
                if cached:
                    cache = cache_from(found.layers)
            self._watched = [sequence]
            try:
                for start in range(cached, len(sequence.context), PREFILL_CHUNK):
                    ids = torch.tensor([sequence.context[start : start + PREFILL_CHUNK]])
                    carried = {} if cache is None else {self._cache_argument: cache}
                    adapter = self._adapters.names_for([sequence.adapter])
                    output = self.model(input_ids=ids, use_cache=True, **carried, **adapter)
                    cache = cache_of(output)
            except _Abandoned:
                output = None  # its cache was its own: nothing else to undo
            finally:
                self._watched = []
            if sequence.abandoned or output is None:
                firsts.append(None)
                continue
            assert cache is not None  # the pass that set output set it
            if self.prefixes is not None:
                self.prefixes.store(
                    sequence.context, [(layer.keys, layer.values) for layer in cache.layers], sequence.adapter
                )
            sequence.cached = cached
            token = self._sample(output.logits[:, -1], [sequence])[0]
            self.batch.add(cache, len(sequence.context), max(token, 0))  # a row that ends feeds any token
            active.append(sequence)
            firsts.append(token)
        return firsts

    def _sample(self, logits: torch.Tensor, sequences: Sequence[Row]) -> list[int]:
        """One token per row, chosen on the row's own terms (``sampling.py``, in vLLM's
        order; with the reply's own generator when seeded). A constrained row's token is
        accepted here (NOTHING_ALLOWED: the constraint allows none, or choosing failed,
        ``failure`` saying why; the decoder ends that reply alone)."""
        tokens = []
        for row, sequence in zip(logits.float(), sequences, strict=True):
            try:
                tokens.append(self._chosen(row, sequence))
            except Exception as exc:  # noqa: BLE001 - this reply ends with it; the others go on
                sequence.failure = exc
                tokens.append(NOTHING_ALLOWED)
        return tokens

    def _chosen(self, row: torch.Tensor, sequence: Row) -> int:
        sampling = sequence.sampling
        if sequence.constraint is not None:
            allowed = allowed_mask(row, sequence.constraint)
            if not bool(allowed.any()):
                return NOTHING_ALLOWED
            row.masked_fill_(~allowed, float("-inf"))
        # The model's own log-probabilities under the grammar, before bias and penalties
        # (vLLM's raw logprobs: its grammar masks the logits before its sampler).
        raw = None if sampling.logprobs is None else torch.log_softmax(row, dim=-1)
        bias(row, sampling)
        if sampling.min_tokens:  # vLLM holds back the end of sequence even with ignore_eos
            hold_stops(row, sampling, len(sequence.reply), {*sampling.stop_token_ids, *self._eos})
        if sampling.penalised:
            penalise(row, sampling, sequence.seen, sequence.reply)
        if not bool(torch.isfinite(row).any()):  # scores that overflowed: no token to choose
            raise ValueError("no token has a finite score (a penalty or bias out of range)")
        token = choose(row, sampling, sequence.generator)
        if sequence.constraint is not None and not self.ends(sequence, token):
            sequence.constraint.accept(token)
        if raw is not None:
            sequence.logprobs = logprobs_of(raw, token, sampling.logprobs or 0)
        return token

    @torch.inference_mode()
    def step(self, active: Sequence[Row]) -> list[int] | None:
        """One token for each row of ``active``; None if a row was abandoned mid-pass (the
        layers that ran have their new position cut off again, so the pass can be redone
        without it)."""
        self.store_kept()
        inputs, width = self.batch.step_inputs(self._cache_argument)
        self._watched = active
        try:
            output = self.model(**inputs, **self._adapters.names_for([s.adapter for s in active]))
        except _Abandoned:
            self.batch.undo(width)
            return None
        finally:
            self._watched = []
        tokens = self._sample(output.logits[:, -1], active)
        self.batch.stepped(cache_of(output), tokens)
        return tokens
