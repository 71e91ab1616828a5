"""LLM serving: Ray Serve LLM's config and names, vLLM's OpenAI endpoints, engines on the
CPU (docs/llm.md). Install with ``pip install 'app_toolkit[llm]'``; importing this module
imports no model library (the engines do, in their replicas)."""

from app_toolkit.llm.config import LLMConfig, LoraConfig, ModelLoadingConfig
from app_toolkit.llm.engine_options import EngineOptions
from app_toolkit.llm.model_source import ModelFiles, resolve_model_source
from app_toolkit.llm.serving_args import LLMServingArgs, serving_args

__all__ = [
    "EngineOptions",
    "LLMConfig",
    "LLMServingArgs",
    "LoraConfig",
    "ModelFiles",
    "ModelLoadingConfig",
    "resolve_model_source",
    "serving_args",
]
