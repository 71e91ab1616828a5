"""What shapes a reply beyond text: a grammar from ``response_format``, tool calls from
``tools`` / ``tool_choice`` (structured.py compiles them), and the deltas that carry them."""

from __future__ import annotations

from typing import Any, Protocol

from app_toolkit.llm.engine import Constraint
from app_toolkit.llm.errors import bad_parameter
from app_toolkit.llm.events import Delta
from app_toolkit.llm.structured import StructuredOutputError, reply_format
from app_toolkit.llm.tool_calls import ToolCallStream


class Structure(Protocol):
    """One reply's structured output: the constraint the engine samples under, and the
    text turned into deltas (tool-call fragments where the reply calls tools)."""

    constraint: Constraint | None

    def feed(self, text: str) -> list[Delta]: ...

    def finish(self) -> list[Delta]: ...

    @property
    def called(self) -> bool: ...


def structure_for(
    tokenizer: Any,
    response_format: dict[str, Any] | None,
    tools: tuple[dict[str, Any], ...],
    tool_choice: str | dict[str, Any] | None,
    parallel_tool_calls: bool = False,
) -> Structure | None:
    """The structure a request asks for, or None for free text; a field that cannot be
    enforced is a 400 naming it (``structured.reply_format``'s check).

    One tool call per reply unless ``parallel_tool_calls``: OpenAI's default is several,
    but a small model allowed another call tends to repeat the first (SmolLM2-135M does),
    and clients such as instructor take one; the endpoints do not pass the field yet."""
    try:
        chosen = reply_format(response_format, tools, tool_choice, parallel_tool_calls)
        constraint = chosen.constraint(tokenizer)
    except StructuredOutputError as error:
        raise bad_parameter(error.param, error.message) from None
    if constraint is None and not chosen.tool_names:
        return None
    return _Shaped(constraint, ToolCallStream() if chosen.tool_names else None)


class _Shaped:
    """One reply under a grammar: its text passed on, or read into tool-call fragments
    where the reply may call tools."""

    def __init__(self, constraint: Constraint | None, calls: ToolCallStream | None) -> None:
        self.constraint = constraint
        self._calls = calls

    def feed(self, text: str) -> list[Delta]:
        if self._calls is None:
            return [Delta(text=text)]
        return _deltas(*self._calls.feed(text))

    def finish(self) -> list[Delta]:
        return [] if self._calls is None else _deltas(*self._calls.finish())

    @property
    def called(self) -> bool:
        return self._calls is not None and self._calls.calls > 0


def _deltas(content: str, fragments: list[dict[str, Any]]) -> list[Delta]:
    deltas = [Delta(text=content)] if content else []
    if fragments:
        deltas.append(Delta(tool_calls=tuple(fragments)))
    return deltas
