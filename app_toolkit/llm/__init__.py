"""LLM serving: Ray Serve LLM's config and names, vLLM's OpenAI endpoints, engines on the
CPU (docs/llm.md). Install with ``pip install 'app_toolkit[llm]'``; importing this module
imports no model library (the engines do, in their replicas).

Besides Ray Serve LLM's names, it publishes what a service of your own builds on (the chat
template's projects do): the engine contract and two engines, the detokenizer and stop
strings, OpenAI's errors, and OpenAI's reply shapes over a model deployment's stream. These
names stay; the modules they live in may move. ``TransformersEngine`` and ``DecoderHooks``
import torch when first read from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app_toolkit.llm.app import build_llm_deployment, build_openai_app
from app_toolkit.llm.config import LLMConfig, LoraConfig, ModelLoadingConfig
from app_toolkit.llm.detokenize import Detokenizer, StopFilter
from app_toolkit.llm.engine import (
    Adapters,
    Capabilities,
    Constraint,
    EmbeddingEngine,
    EngineFailed,
    EngineLoad,
    EngineRequest,
    EngineStopped,
    Logprobs,
    Sampling,
    TextEngine,
    Token,
)
from app_toolkit.llm.engine_options import EngineOptions
from app_toolkit.llm.engines.echo import EchoEngine
from app_toolkit.llm.errors import (
    ANSWERED,
    OpenAIError,
    as_openai_error,
    bad_parameter,
    invalid_request,
    stream_error,
    unknown_model,
)
from app_toolkit.llm.errors import install as install_error_handlers
from app_toolkit.llm.events import Delta
from app_toolkit.llm.openai.chat import completion as chat_completion
from app_toolkit.llm.openai.chat import streamed as chat_stream
from app_toolkit.llm.openai.ingress import OpenAIIngress
from app_toolkit.llm.openai.replies import Stream as DeltaStream
from app_toolkit.llm.openai.replies import open_reply, read_whole, usage
from app_toolkit.llm.openai.response_events import produced as responses_events
from app_toolkit.llm.openai.response_events import streamed as responses_stream
from app_toolkit.llm.openai.responses import Reply as ResponsesReply
from app_toolkit.llm.openai.responses import ResponsesRequest
from app_toolkit.llm.openai.responses import generation as responses_generation
from app_toolkit.llm.openai_shapes import Usage
from app_toolkit.llm.protocol import (
    CHAT_RULES,
    OptionRules,
    StreamOptions,
    checked_options,
    role_of,
    text_content,
)
from app_toolkit.llm.replica.server import LLMServer
from app_toolkit.llm.serving_args import LLMServingArgs

if TYPE_CHECKING:
    from app_toolkit.llm.engines.decoder import DecoderHooks
    from app_toolkit.llm.engines.transformers import TransformersEngine

__all__ = [
    "ANSWERED",
    "Adapters",
    "CHAT_RULES",
    "Capabilities",
    "Constraint",
    "DecoderHooks",
    "Delta",
    "DeltaStream",
    "Detokenizer",
    "EchoEngine",
    "EmbeddingEngine",
    "EngineFailed",
    "EngineLoad",
    "EngineOptions",
    "EngineRequest",
    "EngineStopped",
    "LLMConfig",
    "LLMServer",
    "LLMServingArgs",
    "Logprobs",
    "LoraConfig",
    "ModelLoadingConfig",
    "OpenAIError",
    "OpenAIIngress",
    "OptionRules",
    "ResponsesReply",
    "ResponsesRequest",
    "Sampling",
    "StopFilter",
    "StreamOptions",
    "TextEngine",
    "Token",
    "TransformersEngine",
    "Usage",
    "as_openai_error",
    "bad_parameter",
    "build_llm_deployment",
    "build_openai_app",
    "chat_completion",
    "chat_stream",
    "checked_options",
    "install_error_handlers",
    "invalid_request",
    "open_reply",
    "read_whole",
    "responses_events",
    "responses_generation",
    "responses_stream",
    "role_of",
    "stream_error",
    "text_content",
    "unknown_model",
    "usage",
]

#: Names read from their module on first use: they import torch.
_LAZY = {
    "DecoderHooks": "app_toolkit.llm.engines.decoder",
    "TransformersEngine": "app_toolkit.llm.engines.transformers",
}


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
