"""What shapes a reply beyond text: a grammar from ``response_format`` (or vLLM's
``structured_outputs``), tool calls from ``tools`` / ``tool_choice`` (structured.py compiles
them), and the deltas that carry them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from app_toolkit.llm.engine import Constraint
from app_toolkit.llm.errors import bad_parameter
from app_toolkit.llm.events import Delta, StructuredOutputs
from app_toolkit.llm.replica.structured import StructuredOutputError, reply_format
from app_toolkit.llm.tool_calls import (
    CALL_CLOSE,
    CALL_OPEN,
    CALL_SEPARATOR,
    Fragment,
    ToolCallStream,
    tool_instructions,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from app_toolkit.llm.openai_shapes import ChatMessage, JSONObject


class Structure(Protocol):
    """One reply's structure: the constraint the engine samples under, and the text (with
    the ids of the tokens that wrote it) turned into deltas — tool-call fragments where the
    reply calls tools, reasoning where vLLM's parsers split it off (``parsers.py``)."""

    constraint: Constraint | None

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Delta]: ...

    def finish(self, token_ids: Sequence[int] = ()) -> list[Delta]: ...

    @property
    def called(self) -> bool: ...

    def finish_reason(self, finish: str) -> str:
        """The reply's finish reason, given the engine's (``stop``, ``length``)."""
        ...

    def reasoning_tokens(self) -> int | None:
        """The reply's tokens a reasoning parser counts as reasoning; None without one."""
        ...


def structure_for(
    tokenizer: PreTrainedTokenizerFast | None,
    response_format: Mapping[str, object] | StructuredOutputs | None,
    tools: Sequence[Mapping[str, object]],
    tool_choice: str | Mapping[str, object] | None,
    parallel_tool_calls: bool = False,
) -> Structure | None:
    """The structure a request asks for, or None for free text; a field that cannot be
    enforced is a 400 naming it (``structured.reply_format``'s check).

    One tool call per reply unless ``parallel_tool_calls``: OpenAI's default is several,
    but a small model allowed another call tends to repeat the first (SmolLM2-135M does),
    and clients such as instructor take one; a request's ``parallel_tool_calls: true``
    allows several."""
    return structures_for(tokenizer, response_format, tools, tool_choice, parallel_tool_calls)[0]


def structures_for(
    tokenizer: PreTrainedTokenizerFast | None,
    response_format: Mapping[str, object] | StructuredOutputs | None,
    tools: Sequence[Mapping[str, object]],
    tool_choice: str | Mapping[str, object] | None,
    parallel_tool_calls: bool = False,
    count: int = 1,
    engine: str = "",
) -> list[Structure | None]:
    """:func:`structure_for`, one for each of ``count`` replies (``n`` choices): each
    follows its own grammar state. ``engine``: the name of an engine that takes no
    constraint, for the 400 a grammar gets ("": it takes them)."""
    try:
        chosen = reply_format(response_format, tools, tool_choice, parallel_tool_calls)
        if chosen.grammar is not None and engine:
            raise StructuredOutputError(chosen.field, f"The {engine} engine gives no structured output.")
        constraints = [chosen.constraint(tokenizer) for _ in range(count)]
    except StructuredOutputError as error:
        raise bad_parameter(error.param, error.message, error.code) from None
    if constraints[0] is None and not chosen.tool_names:
        return [None] * count
    return [
        _Shaped(constraint, ToolCallStream() if chosen.tool_names else None) for constraint in constraints
    ]


class _Shaped:
    """One reply under a grammar: its text passed on, or read into tool-call fragments
    where the reply may call tools."""

    def __init__(self, constraint: Constraint | None, calls: ToolCallStream | None) -> None:
        self.constraint = constraint
        self._calls = calls

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Delta]:
        if self._calls is None:
            return [Delta(text=text)]
        return _deltas(*self._calls.feed(text))

    def finish(self, token_ids: Sequence[int] = ()) -> list[Delta]:
        return [] if self._calls is None else _deltas(*self._calls.finish())

    @property
    def called(self) -> bool:
        return self._calls is not None and self._calls.calls > 0

    def finish_reason(self, finish: str) -> str:
        """``tool_calls`` for a reply that stopped after calls (one cut keeps ``length``)."""
        return "tool_calls" if self.called and finish == "stop" else finish

    def reasoning_tokens(self) -> int | None:
        return None


def _deltas(content: str, fragments: list[Fragment]) -> list[Delta]:
    deltas = [Delta(text=content)] if content else []
    if fragments:
        deltas.append(Delta(tool_calls=tuple(fragments)))
    return deltas


def prompt_messages(
    messages: list[JSONObject], tools: Sequence[Mapping[str, object]], template_takes_tools: bool
) -> list[JSONObject]:
    """The conversation as the chat template gets it. A template that shows tools gets the
    messages as they are; for one that does not, the tools are described in the system
    message, earlier calls are written as the model writes them, and tool results are
    passed as ``tool`` turns of text."""
    if template_takes_tools or not (tools or any(_calls_or_results(m) for m in messages)):
        return messages
    converted = [_as_text(message) for message in messages]
    if tools:
        instructions = tool_instructions(tools)
        if converted and converted[0].get("role") in ("system", "developer"):
            first = converted[0]
            converted[0] = {**first, "content": f"{first.get('content') or ''}\n\n{instructions}".strip()}
        else:
            converted.insert(0, {"role": "system", "content": instructions})
    return converted


def template_takes_tools(tokenizer: object) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` argument."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def _calls_or_results(message: ChatMessage) -> bool:
    return bool(message.get("tool_calls")) or message.get("role") == "tool"


def checked_calls(messages: Sequence[ChatMessage]) -> None:
    """Earlier tool calls in the conversation have OpenAI's shape (a 400 naming the first
    that does not), whichever way the template then shows them."""
    for index, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise bad_parameter(f"messages[{index}].tool_calls", "tool_calls is a list of tool calls.")
        for number, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if (
                not isinstance(function, dict)
                or not isinstance(function.get("name"), str)
                or not isinstance(arguments, str | dict | None)
            ):
                raise bad_parameter(
                    f"messages[{index}].tool_calls[{number}]",
                    'A tool call is {"type": "function", "function": {"name": ..., "arguments": "<JSON>"}}.',
                )


def _as_text(message: dict[str, Any]) -> JSONObject:
    """An assistant's calls (checked: :func:`checked_calls`) as its text; a tool result as
    a ``tool`` turn. (``message``'s values read as JSON: its calls have the shape
    :func:`checked_calls` checked.)"""
    calls = message.get("tool_calls")
    if calls:
        written = CALL_SEPARATOR.join(
            CALL_OPEN
            + json.dumps({"name": call["function"]["name"], "arguments": _arguments(call)})
            + CALL_CLOSE
            for call in calls
        )
        text = message.get("content") or ""
        return {"role": "assistant", "content": f"{text}\n{written}".strip() if text else written}
    if message.get("role") == "tool":
        return {"role": "tool", "content": message.get("content") or ""}
    return message


def _arguments(call: Mapping[str, Any]) -> object:
    arguments = call["function"].get("arguments") or "{}"
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
