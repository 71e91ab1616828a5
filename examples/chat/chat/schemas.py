"""What crosses the wire: OpenAI's request shape, and the messages between deployments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .settings import Settings


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=200_000)


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The subset of OpenAI's chat completion request this service honours."""

    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we do not use

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

    def generation(self, settings: Settings) -> Generation:
        """What to generate, with the server's defaults where the request sets nothing."""
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return Generation(
            messages=tuple((message.role, message.content) for message in self.messages),
            max_tokens=self.max_completion_tokens or self.max_tokens or settings.default_max_tokens,
            temperature=settings.default_temperature if self.temperature is None else self.temperature,
            top_p=self.top_p,
            stop=tuple(stop for stop in stops if stop),
        )


@dataclass(frozen=True)
class Generation:
    """One reply to produce: the conversation so far and how to sample."""

    messages: tuple[tuple[str, str], ...]
    max_tokens: int
    temperature: float = 0.3
    top_p: float = 1.0
    stop: tuple[str, ...] = ()

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


class ChatError(Exception):
    """An error the client caused or should hear about, in OpenAI's error shape."""

    def __init__(self, status: int, message: str, type_: str, code: str | None = None) -> None:
        super().__init__(status, message, type_, code)  # all args survive pickling
        self.status = status
        self.message = message
        self.type = type_
        self.code = code

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}
