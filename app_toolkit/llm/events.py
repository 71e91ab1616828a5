"""What the OpenAI ingress and a model's replicas say to each other: typed, picklable."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from app_toolkit.llm.engine import Sampling
from app_toolkit.llm.openai_shapes import ChatMessage, JSONObject, ModelEntry

if TYPE_CHECKING:
    from app_toolkit.llm.tool_calls import Fragment


@dataclass(frozen=True, slots=True)
class StructuredOutputs:
    """vLLM's ``structured_outputs`` as the request sent it, with the ``response_format``
    sent beside it (vLLM reads the two together); the model's replica checks both
    (``replica/structured.py``), where the grammar library is."""

    given: JSONObject
    response_format: JSONObject | None = None


def reply_format_asked(
    response_format: JSONObject | None, structured_outputs: JSONObject | None
) -> JSONObject | StructuredOutputs | None:
    """What :attr:`Generation.response_format` carries for a request's two fields: the
    ``response_format`` alone, or vLLM's ``structured_outputs`` with it."""
    if structured_outputs is None:
        return response_format
    return StructuredOutputs(structured_outputs, response_format)


@dataclass(frozen=True, slots=True)
class Continued:
    """A reply continued on another replica after its own was lost: per choice, the token
    ids its pieces carried to the ingress (:attr:`Delta.tokens`), or None for a choice
    that had finished. The replica reads them as the reply so far and produces the rest."""

    tokens: tuple[tuple[int, ...] | None, ...]


@dataclass(frozen=True, slots=True)
class Generation:
    """One reply to produce: a conversation (``messages``, through the chat template) or a
    ``prompt`` (text or token ids), how to sample, and what must shape the output."""

    sampling: Sampling
    messages: tuple[ChatMessage, ...] = ()
    prompt: str | tuple[int, ...] | None = None
    #: Whether ``sampling.max_tokens`` was the client's (over the window: 400) or the default.
    max_tokens_given: bool = False
    stops: tuple[str, ...] = ()
    #: The stop string that ends the reply stays in its text (vLLM's option).
    include_stop_str_in_output: bool = False
    #: Special tokens the model writes show no text (vLLM's option; False: their text shows).
    skip_special_tokens: bool = True
    #: With special tokens shown, two in a row keep the space a tokenizer may put between
    #: them (vLLM's option; it changes nothing for a byte-level BPE tokenizer's).
    spaces_between_special_tokens: bool = True
    #: What the reply's text must be: the request's ``response_format``, or vLLM's
    #: ``structured_outputs`` (:func:`reply_format_asked`); the model's replica reads it.
    response_format: Mapping[str, object] | StructuredOutputs | None = None
    tools: tuple[JSONObject, ...] = ()
    tool_choice: str | Mapping[str, object] | None = None
    #: Several tool calls in one reply (OpenAI's default): the grammar allows one unless the
    #: request says true; None: not said (vLLM's parsers then keep every call they find).
    parallel_tool_calls: bool | None = None
    #: ``time.time()`` when the ingress took the request: the framework's share of TTFT.
    received_at: float = 0.0
    #: More variables for the chat template (vLLM's ``chat_template_kwargs``).
    template_kwargs: JSONObject | None = None
    #: The template ends the prompt with the assistant's turn opened (vLLM's option).
    add_generation_prompt: bool = True
    #: The reply goes on with the last message, left open (vLLM's option: a prefill).
    continue_final_message: bool = False
    #: The reasoning a reasoning parser splits off is sent (vLLM's option; False: dropped).
    include_reasoning: bool = True
    #: Replies to the prompt, each its own choice (OpenAI's ``n``).
    n: int = 1
    #: How vLLM's parsers (``engine_kwargs.tool_call_parser``, ``reasoning_parser``) read
    #: the replies, where the model has them: "whole" (the ingress reads the reply whole) or
    #: "streamed", as ``vllm serve``'s chat completions read them; "": not read (completions).
    parse: Literal["", "whole", "streamed"] = ""
    #: A completion of several prompts (``prompt`` unused then): prompt ``i``'s ``n``
    #: choices are numbered from ``i * n``.
    prompts: tuple[str | tuple[int, ...], ...] = ()
    #: A reply continued after its replica was lost (``replica/continued.py``); None: a new one.
    continued: Continued | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A reply's token as ``logprobs`` show it: its text, log-probability and bytes, and
    the likeliest tokens' (text, log-probability, bytes), likeliest first."""

    token: str
    logprob: float
    raw: bytes = b""
    top: tuple[tuple[str, float, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of a reply. The first has no text and counts the prompt; the last carries
    why the reply ended and how many tokens it took, with the text held back to the end
    (by a stop string's start, say) if any; those between carry text, reasoning or
    tool-call fragments (OpenAI's ``delta.tool_calls`` items), and the tokens produced so
    far (what a reply cut there is charged)."""

    text: str = ""
    tool_calls: tuple[Fragment, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    #: The log-probabilities of the tokens since the last piece, when the request asks.
    logprobs: tuple[TokenLogprob, ...] = ()
    #: The choice it belongs to (with ``n`` > 1).
    index: int = 0
    #: With the finish reason: the stop string or stop token id that ended the reply (vLLM's).
    stop_reason: str | int | None = None
    #: The model's reasoning, split from its text by vLLM's reasoning parser (vLLM's field).
    reasoning: str = ""
    #: With the finish reason, where a reasoning parser read the reply: its tokens that
    #: parser counts as reasoning (vLLM's ``completion_tokens_details.reasoning_tokens``).
    reasoning_tokens: int | None = None
    #: The ids of the tokens the reply read since its choice's previous piece (those whose
    #: text this piece carries, or holds back): what continues the reply elsewhere if its
    #: replica is lost (:class:`Continued`).
    tokens: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelCard:
    """What ``/v1/models`` says of one model, and what the ingress needs to route to it."""

    id: str
    kind: str  # "generate" or "embed"
    context_window: int
    created: int
    dimensions: int = 0
    #: The engine serving it (its ``name``): "vllm", "transformers", "echo" or "embeddings".
    engine: str = ""

    def entry(self) -> ModelEntry:
        return {
            "id": self.id,
            "object": "model",
            "created": self.created,
            # vLLM's server says "vllm"; this toolkit's own engines say "app_toolkit".
            "owned_by": "vllm" if self.engine == "vllm" else "app_toolkit",
            "root": self.id,
            "parent": None,
            "max_model_len": self.context_window or None,  # 0: not known yet (not loaded)
        }

    def adapter_entry(self, adapter: str) -> ModelEntry:
        """What ``/v1/models`` says of a LoRA adapter of this model (``adapter``: "model:name"),
        as vLLM lists one: its parent is the model."""
        return {**self.entry(), "id": adapter, "root": adapter, "parent": self.id}
