"""OpenAI's request shapes, as the official client and vLLM's server send and read them:
what this server honours is a field; every other option is kept, then ignored, refused
by name, or accepted only at its default (:func:`checked_options`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app_toolkit.llm.engine import MAX_LOGPROBS, Sampling
from app_toolkit.llm.errors import bad_parameter
from app_toolkit.llm.openai_shapes import JSONObject

# The chat template imports these from here (projects made from it must keep working).
from app_toolkit.llm.request_options import CHAT_RULES as CHAT_RULES
from app_toolkit.llm.request_options import COMPLETION_RULES, EMBEDDING_RULES
from app_toolkit.llm.request_options import OptionRules as OptionRules
from app_toolkit.llm.request_options import checked_options as checked_options

#: The longest text a message or prompt may carry, in characters.
MAX_TEXT = 1_000_000
#: The most tokens one request may ask for (its model's context window bounds it further).
MAX_TOKENS = 131_072
#: The seeds taken: a signed 64-bit integer, as vLLM bounds them (torch's seed overflows past).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: The most choices (``n``) one request may ask for: each is a reply of its own.
MAX_CHOICES = 16
#: The most prompts one completions request may hold.
MAX_PROMPTS = 64
#: The most choices one completions request may make in all (prompts times ``n``).
MAX_CHOICES_IN_ALL = 64
#: The most tokens one ``logit_bias`` may name.
MAX_LOGIT_BIAS = 1_024
#: A ``logit_bias`` value is cut to this range, as vLLM cuts it (OpenAI's documented range).
BIAS_LIMIT = 100.0
#: The arguments of transformers' ``apply_chat_template`` (and the names it gives the
#: conversation), which ``chat_template_kwargs`` may not set: only the template's own
#: variables go through (vLLM refuses a request's ``chat_template`` unless told to trust it).
TEMPLATE_ARGUMENTS = frozenset(
    {
        "chat_template",
        "conversation",
        "conversations",
        "messages",
        "tools",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "sanitize_control_tokens",
    }
)
#: Message roles, as chat templates take them (``developer`` is newer clients' ``system``).
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
#: Content part types that carry text: Chat Completions' (``text``), and the Responses
#: API's (``input_text``, and earlier replies' ``output_text`` sent back).
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def role_of(role: str, param: str) -> str:
    """The chat template's role for a message's (:data:`ROLES`); any other is the 400
    naming ``param``."""
    known = ROLES.get(role)
    if known is None:
        raise bad_parameter(
            param,
            f"The role {role!r} is not supported; use system, developer, user or assistant.",
            "unsupported_parameter",
        )
    return known


def text_content(content: Any, param: str) -> str:
    """A message's content as text: a string as it is, text parts joined by newlines; a
    part of any other type is the 400 naming it (``messages[0].content[1].type``)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_parameter(
                f"{param}[{number}].type",
                f"Content parts of type {kind!r} are not supported: this model reads text only "
                f"({', '.join(sorted(TEXT_PARTS))}).",
                "unsupported_parameter",
            )
        texts.append(part["text"])
    return "\n".join(texts)


class StreamOptions(BaseModel):
    """A request's ``stream_options``: ``include_usage`` adds the usage chunk at the end."""

    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's; usage on every chunk: refused

    @field_validator("continuous_usage_stats")
    @classmethod
    def _no_continuous_usage(cls, value: bool) -> bool:
        if value:
            raise ValueError("usage on every chunk is not supported; use include_usage")
        return value


class SamplingFields(BaseModel):
    """vLLM's sampling fields, as its three generating endpoints (chat, completions and
    the Responses API) take them, with vLLM's bounds."""

    model_config = ConfigDict(extra="allow")

    #: vLLM's: what the reply must be (json, regex, choice, grammar, json_object), read in
    #: the model's replica with ``response_format`` (``events.reply_format_asked``).
    structured_outputs: JSONObject | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)  # vLLM's bounds (torch's long)
    # OpenAI's penalties and bias, and vLLM's sampling extras, with vLLM's bounds.
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = Field(None, max_length=MAX_LOGIT_BIAS)
    top_k: int | None = Field(None, ge=-1, le=2**31 - 1)  # -1 and 0: no limit
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    # vLLM's: the text of special tokens the model writes shows (false).
    skip_special_tokens: bool = True

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and (len(stop) > 16 or not all(stop)):
            raise ValueError("stop takes at most 16 non-empty strings")
        return stop

    def sampled(
        self,
        max_tokens: int,
        temperature: float,
        top_p: float,
        logprobs: int | None = None,
        min_tokens: int = 0,
    ) -> Sampling:
        """How the reply's tokens are chosen, with these fields; a ``logit_bias`` key that
        is not a token id is the 400 naming it."""
        return Sampling(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=max(0, self.top_k or 0),
            min_p=self.min_p or 0.0,
            seed=self.seed,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=_biases(self.logit_bias or {}),
            min_tokens=min_tokens,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
        )

    @property
    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(stop for stop in stops if stop)


class _Head(BaseModel):
    """The fields chat and completions requests start with, before the shared sampling
    fields and then each request's own: a request's validation errors are read in field
    order, and the first names the 400's ``param``."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)


class _Request(SamplingFields, _Head):  # (pydantic puts the last base's fields first)
    """Fields chat and completions read."""

    min_tokens: int = Field(0, ge=0, le=MAX_TOKENS)
    # vLLM's: with special tokens shown, two in a row are joined without a space (false;
    # only where the tokenizer's decoder puts one).
    spaces_between_special_tokens: bool = True

    def sampling(self, max_tokens: int | None, default_temperature: float) -> Sampling:
        """How the reply's tokens are chosen, ``max_tokens`` at most (None: as many as the
        context window leaves); a ``logit_bias`` key that is not a token id, or
        ``min_tokens`` above ``max_tokens``, is the 400 naming it."""
        if self.n > 1 and self.temperature == 0:
            raise bad_parameter("n", f"n must be 1 when using greedy sampling, got {self.n}.")
        if max_tokens is not None and self.min_tokens > max_tokens:
            raise bad_parameter(
                "min_tokens",
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {self.min_tokens}.",
            )
        return self.sampled(
            MAX_TOKENS if max_tokens is None else max_tokens,
            default_temperature if self.temperature is None else self.temperature,
            self.top_p,
            self.logprobs_wanted,
            self.min_tokens,
        )

    @property
    def logprobs_wanted(self) -> int | None:
        """How many of the likeliest tokens each token comes with (None: no logprobs)."""
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _checked_stream_options(self) -> None:
        if self.stream_options is not None and self.stream_options.model_fields_set and not self.stream:
            raise bad_parameter("stream_options", "Stream options can only be defined when `stream=True`.")


def _biases(given: dict[str, float]) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as (token id, bias) pairs, each bias cut to ±:data:`BIAS_LIMIT` as
    vLLM cuts it; a key that is not a token id is the 400 naming ``logit_bias``."""
    pairs: dict[int, float] = {}  # one bias a token ("1" and "01" name one: the last counts)
    for key, amount in given.items():
        try:
            token = int(key)
        except ValueError:
            raise bad_parameter(
                "logit_bias", f"logit_bias keys are token ids (integers as strings), got {key[:50]!r}."
            ) from None
        if token < 0:
            raise bad_parameter("logit_bias", f"logit_bias keys are token ids (>= 0), got {token}.")
        if amount != amount:  # NaN
            raise bad_parameter("logit_bias", f"logit_bias[{key!r}] is not a number.")
        pairs[token] = max(-BIAS_LIMIT, min(BIAS_LIMIT, amount))
    return tuple(pairs.items())


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: list[JSONObject] = Field(min_length=1, max_length=2_000)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    response_format: JSONObject | None = None
    tools: list[JSONObject] | None = Field(None, max_length=128)
    tool_choice: str | JSONObject | None = None
    parallel_tool_calls: bool | None = None
    #: vLLM's: more variables for the chat template (``{"enable_thinking": false}``).
    chat_template_kwargs: JSONObject | None = None
    #: vLLM's: the prompt ends with the assistant's turn opened; or, with
    #: ``continue_final_message``, the last message is left open for the reply to go on.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    #: vLLM's: with a reasoning parser, False leaves the reasoning out of the reply.
    include_reasoning: bool = True
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @property
    def logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def checked(self) -> ChatCompletionRequest:
        checked_options(dict(self.model_extra or {}), CHAT_RULES)
        self._checked_stream_options()
        taken = sorted(TEMPLATE_ARGUMENTS.intersection(self.chat_template_kwargs or {}))
        if taken:
            raise bad_parameter(
                "chat_template_kwargs",
                f"chat_template_kwargs may not set {', '.join(taken)}: they say how the prompt is "
                "made, they are not variables of the chat template.",
            )
        if self.continue_final_message and self.add_generation_prompt:
            raise bad_parameter(
                "continue_final_message",
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            )
        if self.top_logprobs and not self.logprobs:
            raise bad_parameter("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.")
        if self.tool_choice is not None and self.tool_choice != "none" and self.tools is None:
            raise bad_parameter("tool_choice", "When using `tool_choice`, `tools` must be set.")
        return self


class CompletionRequest(_Request):
    """``POST /v1/completions``: a prompt as text, token ids, or one of either in a list."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1, le=MAX_TOKENS)  # OpenAI's default for completions
    echo: bool = False
    #: The likeliest tokens each token comes with (0: its own log-probability only).
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @property
    def logprobs_wanted(self) -> int | None:
        return self.logprobs

    def checked(self) -> CompletionRequest:
        checked_options(dict(self.model_extra or {}), COMPLETION_RULES)
        self._checked_stream_options()
        if self.echo and self.logprobs is not None:
            raise bad_parameter(
                "logprobs",
                "logprobs with echo (the prompt's log-probabilities too) is not supported by this "
                "server: leave out echo, or logprobs.",
                "unsupported_parameter",
            )
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompts to complete: one (text or token ids), or each of a list, at most
        :data:`MAX_PROMPTS`, and at most :data:`MAX_CHOICES_IN_ALL` choices with ``n``."""
        prompt = self.prompt
        listed = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], str | list)
        given: list[Any] = list(prompt) if listed else [prompt]  # each text or ids: listed says so
        if len(given) > MAX_PROMPTS:
            raise bad_parameter("prompt", f"prompt holds more than {MAX_PROMPTS} prompts.")
        if len(given) * self.n > MAX_CHOICES_IN_ALL:
            raise bad_parameter(
                "n", f"{len(given)} prompts with n={self.n} make more than {MAX_CHOICES_IN_ALL} choices."
            )
        return [
            _one_prompt(one, f"prompt[{index}]" if listed else "prompt") for index, one in enumerate(given)
        ]


def _one_prompt(prompt: str | list[int], param: str) -> str | list[int]:
    if isinstance(prompt, str):
        if len(prompt) > MAX_TEXT:
            raise bad_parameter(param, f"{param} is longer than {MAX_TEXT} characters.")
        return prompt
    if not prompt:
        raise bad_parameter(param, f"{param} is empty.")
    if not all(isinstance(token, int) for token in prompt):
        raise bad_parameter(param, f"{param} mixes token ids with other values.")
    return [int(token) for token in prompt]


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)

    def inputs(self) -> list[str] | list[list[int]]:
        """What to embed: texts, or token ids (one list per input), as vLLM takes them."""
        checked_options(dict(self.model_extra or {}), EMBEDDING_RULES)
        given: list[str] | list[list[int]]
        if isinstance(self.input, str):
            given = [self.input]
        elif self.input and all(isinstance(item, int) for item in self.input):
            given = [[int(item) for item in self.input if isinstance(item, int)]]  # one input, as ids
        else:
            # Texts or lists of ids (validated: never both).
            given = [item for item in self.input if isinstance(item, str)] or [
                item for item in self.input if isinstance(item, list)
            ]
        if not given:
            raise bad_parameter("input", "input is empty.")
        if len(given) > 2_048:
            raise bad_parameter("input", "input holds more than 2048 inputs.")
        if any(not item for item in given):
            raise bad_parameter("input", "input holds an empty string or an empty list of token ids.")
        if all(isinstance(item, str) for item in given):
            return [str(item) for item in given]
        return [item for item in given if isinstance(item, list)]  # ids: the model's replica checks them


class TokenizeRequest(BaseModel):
    """``POST /tokenize`` (vLLM's): a prompt, or chat messages through the model's template."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = Field(None, max_length=MAX_TEXT)
    messages: list[JSONObject] | None = Field(None, max_length=2_000)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    """``POST /detokenize`` (vLLM's)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[int] = Field(max_length=MAX_TOKENS)
