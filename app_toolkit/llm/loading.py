"""From an :class:`LLMConfig` to its engine, in the model's replica: the model's files
found on this machine and the engine's options in its own terms."""

from __future__ import annotations

from app_toolkit.llm.config import LLMConfig
from app_toolkit.llm.engine import EmbeddingEngine, TextEngine
from app_toolkit.llm.engines import make_engine

#: The echo engine's context window when engine_kwargs.max_model_len sets none.
ECHO_WINDOW = 4096


def engine_for(config: LLMConfig) -> TextEngine | EmbeddingEngine:
    """The engine ``config`` names, constructed (not loaded: the replica calls ``load()``)."""
    options = config.engine_options()
    name = config.engine_name
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
