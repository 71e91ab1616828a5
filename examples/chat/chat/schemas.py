"""What crosses the wire: OpenAI's chat request as this service answers it (read by the
module's rules: :data:`app_toolkit.llm.CHAT_RULES`, here ``MODULE_RULES``), and the
messages between deployments."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from app_toolkit.llm import CHAT_RULES as MODULE_RULES
from app_toolkit.llm import (
    OpenAIError,
    OptionRules,
    StreamOptions,
    bad_parameter,
    checked_options,
    role_of,
    text_content,
)
from pydantic import BaseModel, ConfigDict, Field, field_validator

from .settings import Settings

#: The longest text a message may carry, in characters.
MAX_TEXT = 200_000


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, refusal, …: not used

    role: str = Field(max_length=64)
    content: str | list[dict[str, Any]] | None = Field(None, max_length=MAX_TEXT)
    tool_calls: list[Any] | None = None

    def turn(self, index: int) -> tuple[str, str]:
        """``(role, text)`` for the model: text parts joined by newlines."""
        role = role_of(self.role, f"messages[{index}].role")
        if self.tool_calls:
            raise bad_parameter(
                f"messages[{index}].tool_calls", "This server does not call tools.", "unsupported_parameter"
            )
        return role, text_content(self.content, f"messages[{index}].content")


#: Options that shape the text only, with the values every backend takes: the ``openai``
#: backend passes any other value to its upstream; the local and echo models cannot.
FORWARDED: dict[str, tuple[Any, ...]] = {
    "seed": (None,),
    "response_format": (None, {"type": "text"}),
    "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0),
    "logit_bias": (None, {}),
    "reasoning_effort": (None,),
    "verbosity": (None,),
}

#: Chat Completions options beyond what :class:`ChatCompletionRequest` reads. Refused: the
#: answer would need tool calls, several choices or log probabilities (the ``openai``
#: backend relays such a request whole: :meth:`ChatCompletionRequest.relayed`); and
#: :data:`FORWARDED`, but for the ``openai`` backend. Ignored: as the module ignores them.
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
        **FORWARDED,
    },
    ignored=MODULE_RULES.ignored,
)


def upstream_options(given: dict[str, Any], backend: str) -> dict[str, Any]:
    """The options to pass to an upstream (:data:`FORWARDED`, with the ``openai``
    backend); any other this server cannot honour, or does not know, is the module's 400
    naming it (:func:`~app_toolkit.llm.checked_options`)."""
    forwarded = {name: value for name, value in given.items() if backend == "openai" and name in FORWARDED}
    checked_options({name: value for name, value in given.items() if name not in forwarded}, CHAT_RULES)
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
        upstream = upstream_options(dict(self.model_extra or {}), settings.backend)
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
