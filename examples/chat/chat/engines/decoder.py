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
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from .. import metrics
from ..scaling import EngineLoad

logger = logging.getLogger(__name__)

#: Prompt tokens read per forward pass (bounds the memory a long prompt's pass takes).
PREFILL_CHUNK = 256
#: Weight of the newest decoding step in the step time the load reports (about the last 5 steps).
STEP_WEIGHT = 0.2


class _Abandoned(Exception):
    """Raised between two layers of a forward pass when a reader of a row it computes left."""


@dataclass(eq=False)
class _Sequence:
    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seen: set[int]  # token ids in the prompt and the reply so far, for the repetition penalty
    # At most max_tokens + 1 items: the tokens, then None (done) or the error that ended it.
    out: asyncio.Queue[int | Exception | None] = field(default_factory=asyncio.Queue)
    generated: int = 0
    abandoned: bool = False
    stage: str = "queued"  # then "prefill", then "decode": where a cancellation finds it
    queued_at: float = field(default_factory=time.monotonic)


class Decoder:
    """Decodes up to ``max_batch_size`` sequences together; the rest wait their turn."""

    def __init__(self, model: Any, eos_ids: set[int], max_batch_size: int, repetition_penalty: float) -> None:
        self._model = model
        self._cache_argument = _cache_argument(model)
        self._eos = eos_ids
        self._max_batch_size = max_batch_size
        self._penalty = repetition_penalty
        self._waiting: list[_Sequence] = []
        self._joining: list[_Sequence] = []  # reading their prompts (prefill)
        self._active: list[_Sequence] = []
        self._reset_batch()
        # A forward pass checks these sequences before each layer and stops when one was
        # abandoned, so a cancelled reply frees its place within a layer's time, not a pass's.
        self._watched: list[_Sequence] = []
        layers = getattr(getattr(model, "model", None), "layers", None) or []
        self._hooks = [layer.register_forward_pre_hook(self._stop_if_abandoned) for layer in layers]
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
            running=tuple(s.max_tokens - s.generated for s in holding.values() if not s.abandoned),
            queued=tuple((len(s.prompt), s.max_tokens) for s in self._waiting if not s.abandoned),
            step_s=self.step_s,
        )

    async def generate(
        self, prompt: list[int], max_tokens: int, temperature: float, top_p: float = 1.0
    ) -> AsyncIterator[int]:
        """Token ids of one reply; closing the iterator takes the sequence out of the batch."""
        sequence = _Sequence(prompt, max_tokens, temperature, top_p, set(prompt))
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
            if not finished and sequence.stage != "decode":  # decoding: the model deployment counts it
                metrics.CANCELLATIONS.inc(sequence.stage)
            sequence.abandoned = True  # the loop drops it before the next step
            if sequence.stage == "queued" and sequence in self._waiting:
                self._waiting.remove(sequence)  # its place in the queue is free now

    def _stop_if_abandoned(self, module: Any, args: Any) -> None:
        if any(sequence.abandoned for sequence in self._watched):
            raise _Abandoned

    async def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
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
                metrics.QUEUE_WAIT.observe(now - sequence.queued_at)
            self._joining = joining  # a failure below ends them with the others (_run)
            firsts = await asyncio.to_thread(self._prefill, joining)
            self._joining = []
            self._deliver(joining, firsts)
        self._drop_finished()
        if self._active:
            metrics.BATCH_OCCUPANCY.observe(len(self._active))
            started = time.monotonic()
            tokens = await asyncio.to_thread(self._step)
            if tokens is not None:  # None: a reader left mid-pass; the pass is redone without it
                took = time.monotonic() - started
                self.step_s = took if not self.step_s else self.step_s + STEP_WEIGHT * (took - self.step_s)
                self._deliver(self._active, tokens)

    def _deliver(self, sequences: list[_Sequence], tokens: list[int] | list[int | None]) -> None:
        for sequence, token in zip(sequences, tokens, strict=True):
            if sequence.abandoned or token is None:
                continue
            self.tokens += 1
            sequence.generated += 1
            sequence.stage = "decode"
            sequence.seen.add(token)
            sequence.out.put_nowait(token)
            if token in self._eos or sequence.generated >= sequence.max_tokens:
                sequence.out.put_nowait(None)
                sequence.abandoned = True  # finished: its row goes at the next drop

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
            self._merge(cache, len(sequence.prompt), token)
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
        distribution cut to its top-p mass; tokens already seen are penalised first."""
        tokens = []
        for row, sequence in zip(logits.float(), sequences, strict=True):
            if self._penalty != 1.0:
                seen = torch.tensor(sorted(sequence.seen))
                scores = row[seen]
                row[seen] = torch.where(scores > 0, scores / self._penalty, scores * self._penalty)
            if sequence.temperature <= 0:
                tokens.append(int(row.argmax()))
                continue
            probabilities = torch.softmax(row / sequence.temperature, dim=-1)
            if sequence.top_p < 1.0:
                ordered, order = probabilities.sort(descending=True)
                ordered[ordered.cumsum(0) - ordered > sequence.top_p] = 0  # keep the smallest set above top_p
                tokens.append(int(order[torch.multinomial(ordered, 1)]))
            else:
                tokens.append(int(torch.multinomial(probabilities, 1)))
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
        self._last = torch.tensor([[token] for token in tokens])
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
