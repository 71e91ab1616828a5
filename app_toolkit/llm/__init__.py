"""LLM serving: Ray Serve LLM's config and names, vLLM's OpenAI endpoints, engines on the
CPU (docs/llm.md). Install with ``pip install 'app_toolkit[llm]'``; importing this module
imports no model library (the engines do, in their replicas)."""

from app_toolkit.llm.app import build_llm_deployment, build_openai_app
from app_toolkit.llm.config import LLMConfig, LoraConfig, ModelLoadingConfig
from app_toolkit.llm.engine_options import EngineOptions
from app_toolkit.llm.server import LLMServer
from app_toolkit.llm.serving_args import LLMServingArgs

__all__ = [
    "EngineOptions",
    "LLMConfig",
    "LLMServer",
    "LLMServingArgs",
    "LoraConfig",
    "ModelLoadingConfig",
    "build_llm_deployment",
    "build_openai_app",
]
