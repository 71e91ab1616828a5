"""What crosses the wire: OpenAI's request shape, and the messages between deployments."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from app_toolkit.llm.errors import OpenAIError, bad_parameter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from .settings import Settings

#: The longest text a message may carry, in characters.
MAX_TEXT = 200_000
#: Roles a conversation may hold; ``developer`` is what newer OpenAI clients call ``system``.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ContentPart(BaseModel):
    """One part of a message's content (``{"type": "text", "text": ...}``); parts of other
    types (images, audio, files) are refused by name when the request is read."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(max_length=64)
    text: str | None = Field(None, max_length=MAX_TEXT)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, refusal, …: not used

    role: str = Field(max_length=64)
    content: str | list[ContentPart] | None = Field(None, max_length=MAX_TEXT)
    tool_calls: list[Any] | None = None

    def turn(self, index: int) -> tuple[str, str]:
        """``(role, text)`` for the model: text parts joined by newlines."""
        role = role_of(self.role, f"messages[{index}].role")
        if self.tool_calls:
            raise unsupported(f"messages[{index}].tool_calls", "This server does not call tools.")
        return role, joined_text(self.content, f"messages[{index}].content", frozenset({"text"}))


def role_of(role: str, param: str) -> str:
    """The model's role for a message's; ``tool`` and ``function`` are refused."""
    known = ROLES.get(role)
    if known is None:
        raise unsupported(
            param,
            f"The role {role!r} is not supported; use system, developer, user or assistant "
            "(this server does not call tools).",
        )
    return known


def joined_text(content: str | list[ContentPart] | None, param: str, text_parts: frozenset[str]) -> str:
    """The text of a message's content; a part that is not text is refused by its type."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for number, part in enumerate(content):
        if part.type not in text_parts or part.text is None:
            raise unsupported(
                f"{param}[{number}].type",
                f"Content parts of type {part.type!r} are not supported: this model reads text only "
                f"({', '.join(sorted(text_parts))} parts).",
            )
        texts.append(part.text)
    text = "\n".join(texts)
    if len(text) > MAX_TEXT:
        raise OpenAIError(
            400,
            f"{param} is longer than {MAX_TEXT} characters.",
            "invalid_request_error",
            "string_above_max_length",
            param,
        )
    return text


def unsupported(param: str, message: str) -> OpenAIError:
    return bad_parameter(param, message, "unsupported_parameter")


class StreamOptions(BaseModel):
    include_usage: bool = False


@dataclass(frozen=True)
class OptionRules:
    """What an API does with the options it reads no further: ``{name: values accepted}``
    for ``refused`` (defaults only) and ``forwarded`` (the ``openai`` backend passes any
    value to its upstream; the others accept the default only), and names ``ignored``."""

    refused: dict[str, tuple[Any, ...]]
    forwarded: dict[str, tuple[Any, ...]]
    ignored: frozenset[str]


#: Chat Completions options beyond what :class:`ChatCompletionRequest` reads. Refused: the
#: answer would need tool calls, several choices or log probabilities (the ``openai``
#: backend relays such a request whole: :meth:`ChatCompletionRequest.relayed`). Forwarded:
#: they shape the text only, which an upstream can do and the local and echo models cannot.
CHAT_RULES = OptionRules(
    refused={
        "n": (None, 1),
        "logprobs": (None, False),
        "top_logprobs": (None, 0),
        "tools": (None, []),
        "tool_choice": (None, "none", "auto"),
        "functions": (None, []),
        "function_call": (None, "none", "auto"),
        "audio": (None,),
        "modalities": (None, ["text"]),
        "prediction": (None,),
        "web_search_options": (None,),
    },
    forwarded={
        "seed": (None,),
        "response_format": (None, {"type": "text"}),
        "frequency_penalty": (None, 0),
        "presence_penalty": (None, 0),
        "logit_bias": (None, {}),
        "reasoning_effort": (None,),
        "verbosity": (None,),
    },
    ignored=frozenset(
        {
            "user",
            "store",
            "metadata",
            "service_tier",
            "parallel_tool_calls",
            "safety_identifier",
            "prompt_cache_key",
        }
    ),
)


def checked_options(given: dict[str, Any], backend: str, rules: OptionRules) -> dict[str, Any]:
    """The options to pass to an upstream; raises the 400 OpenAI answers for an option
    this server cannot honour, or for one it does not know, naming it."""
    forwarded = {}
    for name, value in given.items():
        if name in rules.ignored:
            continue
        if name in rules.forwarded and backend == "openai":
            forwarded[name] = value
        elif name in rules.forwarded or name in rules.refused:
            accepted = rules.forwarded.get(name) or rules.refused[name]
            if value not in accepted:
                passed_on = " (the openai backend passes it on)" if name in rules.forwarded else ""
                raise unsupported(
                    name, f"{name}={json.dumps(value)[:100]} is not supported by this server{passed_on}."
                )
        else:
            raise OpenAIError(
                400,
                f"Unrecognized request argument supplied: {name}",
                "invalid_request_error",
                "unknown_parameter",
                name,
            )
    return forwarded


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request: what this service honours, and every other option
    kept to be passed on or refused by name (:func:`checked_options`)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1, max_length=500)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=32_768)
    max_completion_tokens: int | None = Field(None, ge=1, le=32_768)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and (len(stop) > 4 or not all(stop)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stop

    def relayed(self, settings: Settings) -> dict[str, Any] | None:
        """The request as the ``openai`` backend's upstream gets it whole, when it asks for
        what only the upstream can answer (tool calls, several choices, log probabilities,
        image parts: anything :meth:`generation` refuses as unsupported); else None."""
        if settings.backend != "openai":
            return None
        try:
            self.generation(settings)
            return None  # text in, text out: the usual path answers it
        except OpenAIError as exc:
            if exc.code != "unsupported_parameter":
                raise
        body = self.model_dump(mode="json", exclude_unset=True)
        body["model"] = settings.upstream_model
        return body

    def generation(self, settings: Settings) -> Generation:
        """What to generate, with the server's defaults where the request sets nothing."""
        upstream = checked_options(dict(self.model_extra or {}), settings.backend, CHAT_RULES)
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return Generation(
            messages=tuple(message.turn(index) for index, message in enumerate(self.messages)),
            max_tokens=settings.reply_tokens(self.max_completion_tokens or self.max_tokens),
            temperature=settings.default_temperature if self.temperature is None else self.temperature,
            top_p=self.top_p,
            stop=tuple(stop for stop in stops if stop),
            upstream_options=tuple(sorted(upstream.items())),
        )


@dataclass(frozen=True)
class Generation:
    """One reply to produce: the conversation so far and how to sample."""

    messages: tuple[tuple[str, str], ...]
    max_tokens: int
    temperature: float = 0.3
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    #: OpenAI options the ``openai`` backend passes to its upstream as they came.
    upstream_options: tuple[tuple[str, Any], ...] = ()
    #: The reply so far, which the model continues (its first replica was lost mid-reply).
    prefix: str = ""
    #: Whose API key asked for it ("" with keys off): the model charges its tokens there.
    owner: str = ""

    def to_json(self) -> dict[str, Any]:
        """This generation as JSON values (stored with a reply, so another replica can
        take the reply over)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Generation:
        """The generation :meth:`to_json` gave."""
        return cls(
            messages=tuple((role, content) for role, content in data["messages"]),
            max_tokens=data["max_tokens"],
            temperature=data["temperature"],
            top_p=data["top_p"],
            stop=tuple(data["stop"]),
            upstream_options=tuple((name, value) for name, value in data["upstream_options"]),
            prefix=data["prefix"],
            owner=data.get("owner", ""),
        )

    @property
    def last_user_message(self) -> str:
        return next((content for role, content in reversed(self.messages) if role == "user"), "")


@dataclass(frozen=True)
class Delta:
    """A piece of a reply. The first has no text and counts the prompt; the last carries
    why the reply ended and how many tokens it took."""

    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
