"""Continuous batching for a causal language model on the CPU.

Every active reply advances one token per step, all in one forward pass: the key/value
caches of the active sequences sit left-padded in one batch, masked where padded. A new
reply joins at the next step (after its own prompt pass); a finished or abandoned one
leaves at the next step, freeing its row. One task owns the model; the forward passes run
in a worker thread so the replica's event loop keeps serving.

A reply whose reader leaves frees its place within one layer's time, not a pass's: a
queued one leaves the queue at once; a pass (a prompt being read, or a decoding step)
checks before each layer whether a reader of a row it computes left, and stops; a
decoding step's cache is cut back to where it was and the step is done again without
that row.

Each reply samples on its own terms (:class:`~app_toolkit.llm.engine.Sampling`: its
temperature, top-p, seed and stop tokens) and, given a
:class:`~app_toolkit.llm.engine.Constraint`, only among the tokens the constraint allows.
What operators measure (queue waits, batch sizes, replies cancelled before their first
token) reaches them through :class:`DecoderHooks`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from ..engine import Constraint, EngineLoad, Sampling
from .sampling import NOTHING_ALLOWED, choose, penalise, restrict

logger = logging.getLogger(__name__)

#: Prompt tokens read per forward pass (bounds the memory a long prompt's pass takes).
PREFILL_CHUNK = 256
#: Weight of the newest decoding step in the step time the load reports (about the last 5 steps).
STEP_WEIGHT = 0.2


class DecoderHooks:
    """What the decoder reports as it works; override the methods you want (each is
    called on the replica's event loop; one that raises is logged and ignored)."""

    def admitted(self, waited_s: float) -> None:
        """A reply got its place in the batch after waiting ``waited_s`` in the queue."""

    def stepped(self, batch_size: int, took_s: float) -> None:
        """A decoding step gave one token to each of ``batch_size`` replies."""

    def cancelled(self, stage: str) -> None:
        """A reader left before its reply's first token, while it was ``"queued"`` or in
        ``"prefill"`` (reading its prompt). Leaving later is the reader's to count."""


class _Abandoned(Exception):
    """Raised between two layers of a forward pass when a reader of a row it computes left."""


@dataclass(eq=False)
class _Sequence:
    prompt: list[int]
    sampling: Sampling
    constraint: Constraint | None
    generator: torch.Generator | None  # a seeded reply's own random numbers
    seen: set[int]  # token ids in the prompt and the reply so far, for the repetition penalty
    # At most max_tokens + 1 items: the tokens, then None (done) or the error that ended it.
    out: asyncio.Queue[int | Exception | None] = field(default_factory=asyncio.Queue)
    generated: int = 0
    abandoned: bool = False
    stage: str = "queued"  # then "prefill", then "decode": where a cancellation finds it
    queued_at: float = field(default_factory=time.monotonic)
    on_slot: Callable[[], None] | None = None  # its reader's: called when it leaves the queue


class Decoder:
    """Decodes up to ``max_batch_size`` sequences together; the rest wait their turn."""

    def __init__(
        self,
        model: Any,
        eos_ids: Collection[int],
        max_batch_size: int,
        repetition_penalty: float = 1.0,
        hooks: DecoderHooks | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1: none), got {repetition_penalty}")
        self._model = model
        self._cache_argument = _cache_argument(model)
        self._eos = frozenset(eos_ids)
        self._max_batch_size = max_batch_size
        self._penalty = repetition_penalty
        self._hooks = hooks or DecoderHooks()
        self._waiting: list[_Sequence] = []
        self._joining: list[_Sequence] = []  # reading their prompts (prefill)
        self._active: list[_Sequence] = []
        self._reset_batch()
        # A forward pass checks these sequences before each layer and stops when one was
        # abandoned, so a cancelled reply frees its place within a layer's time, not a pass's.
        self._watched: list[_Sequence] = []
        layers = getattr(getattr(model, "model", None), "layers", None) or []
        self._layer_hooks = [layer.register_forward_pre_hook(self._stop_if_abandoned) for layer in layers]
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.tokens = 0
        self.step_s = 0.0  # a decoding step's time lately (0 before the first)

    @property
    def active(self) -> int:
        """Sequences holding a place: decoding, reading their prompt, or queued."""
        return len(self._active) + len(self._joining) + len(self._waiting)

    def current_load(self) -> EngineLoad:
        """The replies in the batch (reading their prompt or decoding) with the tokens each
        may still produce, the queued ones, and the step time. Cheap: one pass over them."""
        # A joining reply enters _active in the prefill's thread before it leaves _joining.
        holding = {id(sequence): sequence for sequence in (*self._joining, *self._active)}
        return EngineLoad(
            slots=self._max_batch_size,
            running=tuple(s.sampling.max_tokens - s.generated for s in holding.values() if not s.abandoned),
            queued=tuple((len(s.prompt), s.sampling.max_tokens) for s in self._waiting if not s.abandoned),
            step_s=self.step_s,
        )

    async def generate(
        self,
        prompt: list[int],
        sampling: Sampling,
        constraint: Constraint | None = None,
        on_slot: Callable[[], None] | None = None,
    ) -> AsyncGenerator[int, None]:
        """Token ids of one reply (as :meth:`TextEngine.generate
        <app_toolkit.llm.engine.TextEngine.generate>` says); closing the iterator takes the
        sequence out of the batch."""
        if not prompt:
            raise ValueError("The prompt is empty: a reply needs at least one token to follow")
        if sampling.max_tokens < 1:
            return
        generator = None if sampling.seed is None else torch.Generator().manual_seed(sampling.seed)
        sequence = _Sequence(prompt, sampling, constraint, generator, set(prompt), on_slot=on_slot)
        self._waiting.append(sequence)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="decoder")
        self._wake.set()
        finished = False
        try:
            while (item := await sequence.out.get()) is not None:
                if isinstance(item, Exception):
                    raise RuntimeError("The model failed while decoding") from item
                yield item
            finished = True
        finally:
            if not finished and sequence.stage != "decode":  # decoding: the reader counts it
                self._report("cancelled", sequence.stage)
            sequence.abandoned = True  # the loop drops it before the next step
            if sequence.stage == "queued" and sequence in self._waiting:
                self._waiting.remove(sequence)  # its place in the queue is free now

    def _stop_if_abandoned(self, module: Any, args: Any) -> None:
        if any(sequence.abandoned for sequence in self._watched):
            raise _Abandoned

    def _report(self, hook: str, *args: Any) -> None:
        self._report_to(getattr(self._hooks, hook), *args)

    def _report_to(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:  # a hook never breaks decoding (STYLE 11)
            logger.exception(
                "The decoder's %s hook failed; decoding goes on", getattr(callback, "__name__", callback)
            )

    async def close(self) -> None:
        for hook in self._layer_hooks:
            hook.remove()
        self._layer_hooks = []
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
            self._task = None

    async def _run(self) -> None:
        while True:
            self._drop_finished()
            if not self._active and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self._advance()
            except Exception as exc:  # every reply in flight ends with the error; the loop goes on
                logger.exception("Decoding failed; ending %d replies", self.active)
                for sequence in self._active + self._joining + self._waiting:
                    if not sequence.abandoned:
                        sequence.out.put_nowait(exc)
                        sequence.abandoned = True
                self._active, self._joining, self._waiting = [], [], []
                self._reset_batch()

    async def _advance(self) -> None:
        """Admit waiting sequences while there is room, then decode one token for each row."""
        room = self._max_batch_size - len(self._active)
        joining, self._waiting = self._waiting[:room], self._waiting[room:]
        if joining:
            now = time.monotonic()
            for sequence in joining:
                sequence.stage = "prefill"
                self._report("admitted", now - sequence.queued_at)
                if sequence.on_slot is not None:
                    self._report_to(sequence.on_slot)
            self._joining = joining  # a failure below ends them with the others (_run)
            firsts = await asyncio.to_thread(self._prefill, joining)
            self._joining = []
            self._deliver(joining, firsts)
        self._drop_finished()
        if self._active:
            started = time.monotonic()
            tokens = await asyncio.to_thread(self._step)
            if tokens is not None:  # None: a reader left mid-pass; the pass is redone without it
                took = time.monotonic() - started
                self.step_s = took if not self.step_s else self.step_s + STEP_WEIGHT * (took - self.step_s)
                self._report("stepped", len(self._active), took)
                self._deliver(self._active, tokens)

    def _deliver(self, sequences: list[_Sequence], tokens: Sequence[int | None]) -> None:
        """Send each row's token to its reader, or end its reply: at an end-of-sequence or
        stop token (not sent), at max_tokens, when its constraint is finished or allows
        nothing (``NOTHING_ALLOWED``)."""
        for sequence, token in zip(sequences, tokens, strict=True):
            if sequence.abandoned or token is None:
                continue
            sequence.stage = "decode"
            if token == NOTHING_ALLOWED or self._ends(sequence, token):
                sequence.out.put_nowait(None)
                sequence.abandoned = True  # finished: its row goes at the next drop
                continue
            self.tokens += 1
            sequence.generated += 1
            sequence.seen.add(token)
            sequence.out.put_nowait(token)
            constrained = sequence.constraint
            if sequence.generated >= sequence.sampling.max_tokens or (constrained and constrained.finished):
                sequence.out.put_nowait(None)
                sequence.abandoned = True

    def _ends(self, sequence: _Sequence, token: int) -> bool:
        """``token`` ends the reply unsent: an end-of-sequence (unless ignored) or stop token."""
        return token in sequence.sampling.stop_token_ids or (
            token in self._eos and not sequence.sampling.ignore_eos
        )

    def _reset_batch(self) -> None:
        self._cache: Any = None  # DynamicCache of the active rows, left-padded
        self._mask = torch.zeros(0, 0, dtype=torch.long)  # 1 where a row has a token
        self._last = torch.zeros(0, 1, dtype=torch.long)  # each row's newest token

    def _drop_finished(self) -> None:
        self._waiting = [sequence for sequence in self._waiting if not sequence.abandoned]
        keep = [index for index, sequence in enumerate(self._active) if not sequence.abandoned]
        if len(keep) == len(self._active):
            return
        self._active = [self._active[index] for index in keep]
        if not keep:
            self._reset_batch()
            return
        self._cache.batch_select_indices(torch.tensor(keep))
        self._mask, self._last = self._mask[keep], self._last[keep]
        start = int(self._mask.any(dim=0).nonzero()[0])  # columns now padding in every row
        if start:
            self._cache = _sliced(self._cache, start)
            self._mask = self._mask[:, start:]

    @torch.inference_mode()
    def _prefill(self, joining: list[_Sequence]) -> list[int | None]:
        """Run each new prompt alone, ``PREFILL_CHUNK`` tokens at a time, then merge its
        cache into the batch. A sequence abandoned meanwhile (its reader left) stops at
        the next layer and gets None instead of a first token."""
        firsts: list[int | None] = []
        for sequence in joining:
            cache: Any = None
            output: Any = None
            self._watched = [sequence]
            try:
                for start in range(0, len(sequence.prompt), PREFILL_CHUNK):
                    ids = torch.tensor([sequence.prompt[start : start + PREFILL_CHUNK]])
                    carried = {} if cache is None else {self._cache_argument: cache}
                    output = self._model(input_ids=ids, use_cache=True, **carried)
                    cache = _cache_of(output)
            except _Abandoned:
                output = None  # its cache was its own: nothing else to undo
            finally:
                self._watched = []
            if sequence.abandoned or output is None:
                firsts.append(None)
                continue
            token = self._sample(output.logits[:, -1], [sequence])[0]
            self._merge(cache, len(sequence.prompt), max(token, 0))  # a row that ends feeds any token
            self._active.append(sequence)
            firsts.append(token)
        return firsts

    def _merge(self, cache: Any, length: int, token: int) -> None:
        if self._cache is None:
            self._cache, self._mask = cache, torch.ones(1, length, dtype=torch.long)
            self._last = torch.tensor([[token]])
            return
        width = max(self._mask.shape[1], length)
        merged = DynamicCache()
        for index, (old, new) in enumerate(zip(self._cache.layers, cache.layers, strict=True)):
            keys = torch.cat([_left_pad(old.keys, width), _left_pad(new.keys, width)])
            values = torch.cat([_left_pad(old.values, width), _left_pad(new.values, width)])
            merged.update(keys, values, index)
        self._cache = merged
        mask = torch.zeros(len(self._active) + 1, width, dtype=torch.long)
        mask[:-1, width - self._mask.shape[1] :] = self._mask
        mask[-1, width - length :] = 1
        self._mask = mask
        self._last = torch.cat([self._last, torch.tensor([[token]])])

    def _sample(self, logits: torch.Tensor, sequences: list[_Sequence]) -> list[int]:
        """One token per row: greedy at temperature 0, else sampled from the tempered
        distribution cut to its top-p mass (with the reply's own generator when seeded);
        tokens already seen are penalised first, tokens the constraint refuses masked out.
        A constrained row's token is accepted here (NOTHING_ALLOWED: the constraint
        allows none; ``_deliver`` ends it)."""
        tokens = []
        for row, sequence in zip(logits.float(), sequences, strict=True):
            penalise(row, sequence.seen, self._penalty)
            if sequence.constraint is not None and not restrict(row, sequence.constraint):
                tokens.append(NOTHING_ALLOWED)
                continue
            token = choose(row, sequence.sampling, sequence.generator)
            if sequence.constraint is not None and not self._ends(sequence, token):
                sequence.constraint.accept(token)
            tokens.append(token)
        return tokens

    @torch.inference_mode()
    def _step(self) -> list[int] | None:
        """One token for each row; None if a row was abandoned mid-pass (the layers that
        ran have their new position cut off again, so the pass can be redone without it)."""
        positions = self._mask.sum(dim=1, keepdim=True)  # each row's own length so far
        width = self._mask.shape[1]
        self._mask = torch.cat([self._mask, torch.ones(len(self._active), 1, dtype=torch.long)], dim=1)
        self._watched = self._active
        try:
            output = self._model(
                input_ids=self._last,
                attention_mask=self._mask,
                position_ids=positions,
                use_cache=True,
                **{self._cache_argument: self._cache},
            )
        except _Abandoned:
            self._cache = _cut(self._cache, width)
            self._mask = self._mask[:, :width]
            return None
        finally:
            self._watched = []
        self._cache = _cache_of(output)
        tokens = self._sample(output.logits[:, -1], self._active)
        self._last = torch.tensor([[max(token, 0)] for token in tokens])  # a row that ends feeds any token
        return tokens


def _cache_argument(model: Any) -> str:
    """The forward keyword that takes the key/value cache: transformers 5.24 renamed
    ``past_key_values`` to ``cache`` (the old name warns, and goes in 5.40)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(output: Any) -> Any:
    cache = getattr(output, "cache", None)  # the field's name from transformers 5.24 on
    return cache if cache is not None else output.past_key_values


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(tensor, (0, 0, width - tensor.shape[2], 0))


def _cut(cache: Any, width: int) -> Any:
    """The cache's first ``width`` positions, in every layer (some may hold one more)."""
    kept = DynamicCache()
    for index, layer in enumerate(cache.layers):
        kept.update(layer.keys[:, :, :width], layer.values[:, :, :width], index)
    return kept


def _sliced(cache: Any, start: int) -> Any:
    trimmed = DynamicCache()
    for index, layer in enumerate(cache.layers):
        trimmed.update(layer.keys[:, :, start:], layer.values[:, :, start:], index)
    return trimmed
