"""What shapes a reply beyond text: a grammar from ``response_format``, tool calls from
``tools`` / ``tool_choice`` (structured.py compiles them), and the deltas that carry them."""

from __future__ import annotations

from typing import Any, Protocol

from app_toolkit.llm.engine import Constraint
from app_toolkit.llm.errors import bad_parameter
from app_toolkit.llm.events import Delta


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
) -> Structure | None:
    """The structure a request asks for, or None for free text."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text" and (not tools or tool_choice == "none"):
        return None
    raise bad_parameter("response_format", "Structured output is not available yet.", "unsupported_parameter")
