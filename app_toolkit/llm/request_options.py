"""What each OpenAI endpoint does with the request options it reads no further: refuse
them by name unless at the value that means "not used", ignore them, or (a field neither
OpenAI nor vLLM has) refuse it as OpenAI does or ignore it and log it once, as vLLM does.
``protocol.py`` holds the request shapes that use these rules."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from app_toolkit.llm.errors import OpenAIError, bad_parameter

logger = logging.getLogger("app_toolkit.llm")

#: How many unknown field names are logged (each once); later ones are not.
MAX_UNKNOWN_LOGGED = 256


@dataclass(frozen=True)
class OptionRules:
    """What an endpoint does with options it reads no further: ``refused`` maps a name to
    the values accepted (defaults only); ``ignored`` names options that change nothing here;
    any other is ``unknown``: a 400 naming it (``"refuse"``, OpenAI's answer), or ignored
    and logged once per name at info (``"log"``, vLLM's way; it logs at debug)."""

    refused: dict[str, tuple[object, ...]]
    ignored: frozenset[str]
    unknown: Literal["refuse", "log"] = "refuse"


#: Sent by OpenAI's clients and harmless to leave unread.
_IGNORED = frozenset(
    {
        "user",
        "store",
        "metadata",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "parallel_tool_calls",
    }
)

#: vLLM's request fields this server does not honour yet (docs/llm.md lists why), each
#: taken at the value that means "not used" and otherwise a 400 naming it: known to vLLM,
#: they are not ignored as unknown fields are.
_VLLM_REFUSED: dict[str, tuple[object, ...]] = {
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "watermarking": (None,),
    "truncate_prompt_tokens": (None,),
    "truncation_side": (None,),
    "prompt_logprobs": (None,),
    "logprob_token_ids": (None,),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "priority": (None, 0),
    "return_tokens_as_token_ids": (None, False),
    "return_token_ids": (None, False),
    "return_token_offsets": (None, False),
    "mm_processor_kwargs": (None,),
    "media_io_kwargs": (None,),
    "cache_salt": (None,),
    "kv_transfer_params": (None,),
    "ec_transfer_params": (None,),
    "vllm_xargs": (None,),
    "repetition_detection": (None,),
    "thinking_token_budget": (None,),
    "stream_interval": (None,),
}
#: vLLM's fields that change nothing here.
_VLLM_IGNORED = frozenset(
    {"request_id", "session_id", "mm_payload", "return_mm_kwargs", "routed_experts_prompt_start"}
)

CHAT_RULES = OptionRules(
    refused={
        **_VLLM_REFUSED,
        "echo": (None, False),
        "add_special_tokens": (None, False),
        "documents": (None,),
        "chat_template": (None,),
        "return_prompt_text": (None, False),
        "functions": (None, []),
        "function_call": (None, "none", "auto"),
        "audio": (None,),
        "modalities": (None, ["text"]),
        "prediction": (None,),
        "web_search_options": (None,),
        "reasoning_effort": (None,),
        "verbosity": (None,),
    },
    ignored=_IGNORED | _VLLM_IGNORED,
    unknown="log",
)

COMPLETION_RULES = OptionRules(
    refused={
        **_VLLM_REFUSED,
        "add_special_tokens": (None, True),
        "response_format": (None,),
        "prompt_embeds": (None,),
        "best_of": (None, 1),
        "suffix": (None, ""),
    },
    ignored=_IGNORED | _VLLM_IGNORED,
    unknown="log",
)

EMBEDDING_RULES = OptionRules(refused={}, ignored=_IGNORED, unknown="log")


def checked_options(given: Mapping[str, object], rules: OptionRules) -> None:
    """Raises the 400 OpenAI answers for an option this server cannot honour, or for one it
    does not know (unless ``rules`` ignore those: logged once), naming it."""
    for name, value in given.items():
        if name in rules.ignored:
            continue
        accepted = rules.refused.get(name)
        if accepted is None and rules.unknown == "log":
            _log_unknown(name)
            continue
        if accepted is None:
            raise OpenAIError(
                400,
                f"Unrecognized request argument supplied: {name}",
                "invalid_request_error",
                "unknown_parameter",
                name,
            )
        if value not in accepted:
            raise bad_parameter(
                name,
                f"{name}={json.dumps(value)[:100]} is not supported by this server.",
                "unsupported_parameter",
            )


_unknown_logged: set[str] = set()


def _log_unknown(name: str) -> None:
    """Say once per field name (up to :data:`MAX_UNKNOWN_LOGGED` names) that it was ignored."""
    name = name[:100]
    if name in _unknown_logged or len(_unknown_logged) >= MAX_UNKNOWN_LOGGED:
        return
    _unknown_logged.add(name)
    logger.info("A request field this server does not know was ignored: %s", name)
