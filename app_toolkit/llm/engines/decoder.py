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
that row. The passes themselves, and the sampling of each row's token, are
``forward_passes.py``'s; this module is the loop around them.

A prompt that starts like a sequence read before reads only the rest: with a
:class:`~.prefix_cache.PrefixCache`, a prompt's keys and values are kept once read, and a
reply's (prompt and tokens) once it ends.

Replies may each name a LoRA adapter (``adapters.py``): rows of different adapters share a
batch (peft's ``adapter_names``), up to ``max_adapters`` adapters in a batch. Adapters are
attached and detached between two passes (:meth:`Decoder.attach`, :meth:`Decoder.detach`);
one still used by a reply is detached once no reply uses it.

Each reply samples on its own terms (:class:`~app_toolkit.llm.engine.Sampling`: its
temperature, top-p, seed and stop tokens) and, given a
:class:`~app_toolkit.llm.engine.Constraint`, only among the tokens the constraint allows.
What operators measure (queue waits, batch sizes, replies cancelled before their first
token) reaches them through :class:`DecoderHooks`.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from ..engine import (
    Constraint,
    EngineFailed,
    EngineLoad,
    EngineRequest,
    EngineStopped,
    Logprobs,
    Sampling,
    Token,
)
from .adapters import AdapterFiles, AttachedAdapters
from .forward_passes import ForwardPasses
from .prefix_cache import PrefixCache
from .sampling import NOTHING_ALLOWED, skip_draws

logger = logging.getLogger(__name__)

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


@dataclass(eq=False)
class _Sequence:
    prompt: list[int]
    sampling: Sampling
    constraint: Constraint | None
    generator: torch.Generator | None  # a seeded reply's own random numbers
    seen: set[int]  # token ids in the prompt and the reply so far (repetition_penalty)
    # At most max_tokens + 1 items: the tokens, then None (done) or the error that ended it.
    out: asyncio.Queue[Token | Exception | None] = field(default_factory=asyncio.Queue)
    generated: int = 0
    abandoned: bool = False
    stage: str = "queued"  # then "prefill", then "decode": where a cancellation finds it
    queued_at: float = field(default_factory=time.monotonic)
    on_slot: Callable[[], None] | None = None  # its reader's: called when it leaves the queue
    on_prompt: Callable[[int], None] | None = None  # its reader's: called with the tokens cached
    cached: int = -1  # prompt tokens found in the prefix cache (-1: the prompt is not read yet)
    reply: list[int] = field(default_factory=list)  # the tokens sent
    adapter: str = ""  # the LoRA adapter it decodes with ("": the base model)
    priority: int = 0  # its caller's class: the queue is kept in this order (lower first)
    finished: bool = False  # ended by the decoder (not left by its reader)
    logprobs: Logprobs | None = None  # the newest token's, when the reply asks for them
    failure: Exception | None = None  # why choosing its token failed (its reply ends with it)
    context: list[int] = field(init=False)  # what its prompt pass reads: prompt + reply (carried)

    def __post_init__(self) -> None:
        self.context = self.prompt + self.reply


class Decoder:
    """Decodes up to ``max_batch_size`` sequences together; the rest wait their turn."""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_ids: Collection[int],
        max_batch_size: int,
        hooks: DecoderHooks | None = None,
        prefix_cache: PrefixCache | None = None,
        max_adapters: int = 0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self._max_batch_size = max_batch_size
        self._hooks = hooks or DecoderHooks()
        self._max_adapters = max_adapters  # distinct adapters in one batch (0: no limit)
        self._adapters = AttachedAdapters()
        # The model, the batch's keys and values and the passes over them (in a worker thread).
        self._passes = ForwardPasses(model, eos_ids, self._adapters, prefix_cache)
        self._waiting: list[_Sequence] = []
        self._joining: list[_Sequence] = []  # reading their prompts (prefill)
        self._active: list[_Sequence] = []  # in the batch's rows, in order
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.tokens = 0
        self.step_s = 0.0  # a decoding step's time lately (0 before the first)
        self._skipping: ThreadPoolExecutor | None = None  # skips a continued seeded reply's draws

    @property
    def active(self) -> int:
        """Sequences holding a place: decoding, reading their prompt, or queued."""
        return len(self._active) + len(self._joining) + len(self._waiting)

    def current_load(self) -> EngineLoad:
        """The replies in the batch (reading their prompt or decoding) with the tokens each
        may still produce, the queued ones, and the step time. Cheap: one pass over them."""
        # A joining reply enters _active in the prefill's thread before it leaves _joining.
        holding = {id(sequence): sequence for sequence in (*self._joining, *self._active)}
        return EngineLoad.of(
            self._max_batch_size,
            tuple(s.sampling.max_tokens - s.generated for s in holding.values() if not s.abandoned),
            tuple(
                (len(s.context), s.sampling.max_tokens - s.generated)
                for s in self._waiting
                if not s.abandoned
            ),
            step_s=self.step_s,
        )

    async def generate(self, request: EngineRequest) -> AsyncGenerator[Token, None]:
        """The tokens of one reply (as :meth:`TextEngine.generate
        <app_toolkit.llm.engine.TextEngine.generate>` says); closing the iterator takes the
        sequence out of the batch. ``request.adapter``: an attached LoRA adapter. A reply
        continued (``request.produced``) reads its tokens after the prompt, in the same
        pass, and counts them as its own."""
        prompt, sampling, adapter = request.prompt, request.sampling, request.adapter
        produced = list(request.produced)
        self._check_open(adapter)
        if not prompt:
            raise ValueError("The prompt is empty: a reply needs at least one token to follow")
        if sampling.max_tokens <= len(produced):
            return
        generator = None if sampling.seed is None else torch.Generator().manual_seed(sampling.seed)
        if generator is not None and produced and not sampling.greedy:
            # Continued: its random numbers skip the draws its tokens so far took, so it draws
            # the rest as the unbroken reply would have (in a thread of their own: a long
            # reply's take a while, and the batch's passes go on meanwhile).
            if self._skipping is None:
                self._skipping = ThreadPoolExecutor(1, thread_name_prefix="skip-draws")
            await asyncio.get_running_loop().run_in_executor(
                self._skipping, skip_draws, generator, self._passes.logits_width, len(produced)
            )
            self._check_open(adapter)  # again after that wait: the engine may have stopped
        sequence = _Sequence(
            prompt,
            sampling,
            request.constraint,
            generator,
            {*prompt, *produced},
            on_slot=request.on_slot,
            on_prompt=request.on_prompt,
            reply=produced,
            generated=len(produced),
            adapter=adapter,
            priority=request.priority,
        )
        # After those of its class and the lower ones, ahead of the higher (vLLM's order).
        bisect.insort_right(self._waiting, sequence, key=_priority)
        self._start()
        finished = False
        try:
            while (item := await sequence.out.get()) is not None:
                if isinstance(item, EngineStopped):
                    raise item
                if isinstance(item, Exception):
                    raise EngineFailed("The model failed while decoding") from item
                yield item
            finished = True
        finally:
            if not finished and sequence.stage != "decode":  # decoding: the reader counts it
                self._report("cancelled", sequence.stage)
            sequence.abandoned = True  # the loop drops it before the next step
            if sequence.stage == "queued" and sequence in self._waiting:
                self._waiting.remove(sequence)  # its place in the queue is free now

    @property
    def adapters(self) -> set[str]:
        """The adapters attached."""
        return self._adapters.names

    async def attach(self, adapter: AdapterFiles) -> float:
        """Add ``adapter`` to the model between two passes (at once if it is attached, or
        was to be detached: it stays). Returns how long the passes waited for it (s).
        Raises EngineStopped once the decoder has closed (or closes before the attach)."""
        if self._stopped:
            raise EngineStopped("The engine has stopped: it attaches no more adapters")
        done = self._adapters.attach(adapter)
        if done is None:
            return 0.0
        self._start()
        return await done

    def detach(self, adapter_id: str) -> None:
        """Remove an adapter once no reply uses it (between two passes); its prefix cache
        entries go with it."""
        if self._adapters.detach(adapter_id):
            self._start()

    @property
    def _stopped(self) -> bool:
        """Closed, or its loop died of a fault: nothing decodes any more."""
        return self._closed or (self._task is not None and self._task.done())

    def _start(self) -> None:
        if self._stopped:  # nothing decodes any more (a release after the close, say)
            return
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="decoder")
        self._wake.set()

    def hold(self, adapter_id: str) -> None:
        """A request will decode with ``adapter_id`` (attached): it is not detached until
        :meth:`release`, even before the request's reply joins the queue."""
        self._adapters.hold(adapter_id)

    def release(self, adapter_id: str) -> None:
        self._adapters.release(adapter_id)
        if self._adapters.pending:
            self._start()

    async def _between_passes(self) -> None:
        """The adapters' work on the model, in the passes' thread, while no pass runs."""

        def in_use() -> set[str]:
            return {s.adapter for s in (*self._waiting, *self._joining, *self._active) if not s.abandoned}

        passes = self._passes
        if passes.to_keep:  # kept first, so an adapter detached now takes its entries with it
            await asyncio.to_thread(passes.store_kept)
        forget = passes.prefixes.clear if passes.prefixes is not None else lambda adapter: None
        passes.use(await self._adapters.work(passes.model, in_use, forget))

    def _report(self, hook: str, *args: object) -> None:
        self._report_to(getattr(self._hooks, hook), *args)

    def _report_to(self, callback: Callable[..., None], *args: object) -> None:
        try:
            callback(*args)
        except Exception:  # a hook never breaks decoding (STYLE 11)
            logger.exception(
                "The decoder's %s hook failed; decoding goes on", getattr(callback, "__name__", callback)
            )

    def check_health(self) -> None:
        """Raise if the decoding loop has ended (it ends only by close() or a fault)."""
        task = self._task
        if task is not None and task.done() and not task.cancelled():
            raise RuntimeError("The decoder's loop has ended") from task.exception()

    def _check_open(self, adapter: str) -> None:
        """The engine takes a reply now, with ``adapter`` attached ("": the base model)."""
        if adapter and (adapter not in self._adapters.names or adapter == self._adapters.detaching_now):
            raise ValueError(f"The adapter {adapter!r} is not attached: attach it first")
        if self._stopped:
            raise EngineStopped("The engine has stopped: it takes no more replies")

    async def close(self) -> None:
        """Stop decoding; every reply still open ends with :class:`EngineStopped`."""
        self._closed = True
        if self._skipping is not None:
            self._skipping.shutdown(wait=False)  # a skip under way ends, then its reply is refused
        self._passes.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
            self._task = None
        self._end_all(None)
        self._adapters.stopped()

    def _end_all(self, error: Exception | None) -> None:
        """End every reply in flight with ``error`` (None: the engine stopped, each reply
        with an :class:`EngineStopped` of its own)."""
        for sequence in self._active + self._joining + self._waiting:
            if not sequence.abandoned:
                stopped = EngineStopped("The engine stopped before the reply was complete")
                sequence.out.put_nowait(stopped if error is None else error)
                sequence.abandoned = True
        self._active, self._joining, self._waiting = [], [], []

    async def _run(self) -> None:
        try:
            await self._decoding()
        except Exception:  # a fault outside a pass: the replies and attaches in flight end
            logger.exception("The decoding loop ended; ending %d replies", self.active)
            self._end_all(None)
            self._adapters.stopped()
            raise  # check_health() reads it: the replica is replaced

    async def _decoding(self) -> None:
        while True:
            self._drop_finished()
            if self._adapters.pending:
                await self._between_passes()
            if not self._active and not self._waiting:
                if self._passes.to_keep:  # idle: the ended replies' views would hold the last batch
                    try:
                        await asyncio.to_thread(self._passes.store_kept)
                    except Exception:  # the cache misses them; decoding goes on
                        logger.exception("Keeping ended replies in the prefix cache failed")
                    continue  # a request may have come meanwhile: its wake-up must not be cleared
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self._advance()
            except Exception as exc:  # every reply in flight ends with the error; the loop goes on
                logger.exception("Decoding failed; ending %d replies", self.active)
                self._end_all(exc)
                self._passes.batch.reset()

    async def _advance(self) -> None:
        """Admit waiting sequences while there is room, then decode one token for each row."""
        joining, self._waiting = self._joiners(self._max_batch_size - len(self._active))
        if joining:
            now = time.monotonic()
            for sequence in joining:
                sequence.stage = "prefill"
                self._report("admitted", now - sequence.queued_at)
                if sequence.on_slot is not None:
                    self._report_to(sequence.on_slot)
            self._joining = joining  # a failure below ends them with the others (_run)
            firsts = await asyncio.to_thread(self._passes.prefill, joining, self._active)
            self._joining = []
            for sequence in joining:
                if sequence.on_prompt is not None and sequence.cached >= 0:
                    # Carried tokens found cached are no prompt tokens of the reply's.
                    self._report_to(sequence.on_prompt, min(sequence.cached, len(sequence.prompt)))
            self._deliver(joining, firsts)
        self._drop_finished()
        if self._active:
            started = time.monotonic()
            tokens = await asyncio.to_thread(self._passes.step, self._active)
            if tokens is not None:  # None: a reader left mid-pass; the pass is redone without it
                took = time.monotonic() - started
                self.step_s = took if not self.step_s else self.step_s + STEP_WEIGHT * (took - self.step_s)
                self._report("stepped", len(self._active), took)
                self._deliver(self._active, tokens)

    def _joiners(self, room: int) -> tuple[list[_Sequence], list[_Sequence]]:
        """The waiting sequences that join now, in order, and those that keep waiting: up
        to ``room``, and while the batch holds at most ``max_adapters`` adapters."""
        if not self._max_adapters:
            return self._waiting[:room], self._waiting[room:]
        batch = {sequence.adapter for sequence in self._active if sequence.adapter}
        joining: list[_Sequence] = []
        waiting: list[_Sequence] = []
        blocked = False  # an adapter's reply waits for room: none of another adapter passes it
        for sequence in self._waiting:
            fits = not sequence.adapter or sequence.adapter in batch or len(batch) < self._max_adapters
            fits = fits and not (blocked and sequence.adapter)
            blocked = blocked or (bool(sequence.adapter) and not fits)
            if len(joining) < room and fits:
                joining.append(sequence)
                if sequence.adapter:
                    batch.add(sequence.adapter)
            else:
                waiting.append(sequence)
        return joining, waiting

    def _deliver(self, sequences: list[_Sequence], tokens: Sequence[int | None]) -> None:
        """Send each row's token to its reader, or end its reply: at an end-of-sequence or
        stop token (sent marked ``ends``), at max_tokens, when its constraint is finished or allows
        nothing (``NOTHING_ALLOWED``)."""
        for sequence, token in zip(sequences, tokens, strict=True):
            if sequence.abandoned or token is None:
                continue
            sequence.stage = "decode"
            if sequence.failure is not None:
                logger.error("Choosing a reply's token failed; ending that reply", exc_info=sequence.failure)
                sequence.out.put_nowait(sequence.failure)
                sequence.abandoned = True
                continue
            if token == NOTHING_ALLOWED or self._passes.ends(sequence, token):
                if token != NOTHING_ALLOWED:  # the end of sequence or stop token: counted, not shown
                    sequence.out.put_nowait(Token(token, sequence.logprobs, ends=True))
                sequence.out.put_nowait(None)
                sequence.abandoned = sequence.finished = True  # its row goes at the next drop
                continue
            self.tokens += 1
            sequence.generated += 1
            sequence.seen.add(token)
            sequence.reply.append(token)
            sequence.out.put_nowait(Token(token, sequence.logprobs))
            constrained = sequence.constraint
            if sequence.generated >= sequence.sampling.max_tokens or (constrained and constrained.finished):
                sequence.out.put_nowait(None)
                sequence.abandoned = sequence.finished = True

    def _drop_finished(self) -> None:
        self._waiting = [sequence for sequence in self._waiting if not sequence.abandoned]
        keep = [index for index, sequence in enumerate(self._active) if not sequence.abandoned]
        if len(keep) == len(self._active):
            return
        self._passes.keep_rows(self._active, keep)
        self._active = [self._active[index] for index in keep]


def _priority(sequence: _Sequence) -> int:
    return sequence.priority
