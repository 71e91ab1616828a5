"""Structured output: what a request's ``response_format``, ``tools``, ``tool_choice`` and
``parallel_tool_calls`` allow its reply to be, as one grammar enforced while decoding.

:func:`reply_format` reads the request's fields (OpenAI's JSON) and checks them, including
each schema against the grammar library, so a bad request gets its 400 before any token is
generated; it needs no tokenizer (the model's replica calls it, before building the prompt). The
:class:`ReplyFormat` it returns is small and picklable: the model's replica turns it into
one :class:`~app_toolkit.llm.engine.Constraint` per reply with :meth:`ReplyFormat.constraint`
(``grammar.py``), and the text back into tool calls with ``tool_calls.py``'s parsers.

What a reply may be:

- ``response_format`` ``text`` (or none) and no tool calls: anything (no constraint);
- ``json_object``: one JSON object; ``json_schema``: one JSON document that follows its
  ``schema`` (``strict`` or not: always enforced);
- ``tool_choice`` ``"required"``: tool calls only (one with ``parallel_tool_calls``
  false); a named function: one call to it; ``"auto"`` (the default with tools): the
  reply of ``response_format`` or tool calls, chosen by the model's first tokens;
  ``"none"`` (the default without tools): the reply of ``response_format``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app_toolkit.exceptions import AppToolkitError
from app_toolkit.llm.engine import Constraint
from app_toolkit.llm.tool_calls import TEXT_RULE, calls_rules, json_rule

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

#: Function names OpenAI accepts.
_FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NO_PARAMETERS: Mapping[str, object] = {"type": "object", "properties": {}, "additionalProperties": False}


class StructuredOutputError(AppToolkitError, ValueError):
    """A request's ``param`` cannot be enforced; ``message`` says why and what to send
    instead (the server answers 400 ``invalid_request_error`` naming ``param``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(param, message)

    @property
    def param(self) -> str:
        """The request field at fault (``response_format``, ``tools``, ``tool_choice``)."""
        return str(self.args[0])

    @property
    def message(self) -> str:
        """What is wrong and how to fix it."""
        return str(self.args[1])

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class ReplyFormat:
    """What one request's replies may be: a grammar (llguidance's Lark syntax; None: free
    text) and the tools they may call (empty: the reply is never read for calls)."""

    grammar: str | None = None
    tool_names: tuple[str, ...] = ()

    def constraint(self, tokenizer: PreTrainedTokenizerFast | None) -> Constraint | None:
        """A new constraint for one reply over ``tokenizer`` (the engine's Hugging Face
        tokenizer); None when the reply is free text. One per reply: it holds the
        reply's position in the grammar."""
        if self.grammar is None:
            return None
        if tokenizer is None:
            raise StructuredOutputError(
                "tool_choice" if self.tool_names else "response_format",
                "this model's engine has no tokenizer to constrain its replies with: send "
                "the request without response_format and tools, or serve a model that has one",
            )
        from .grammar import GrammarError, grammar_constraint  # torch: the model's replica only

        try:
            return grammar_constraint(tokenizer, self.grammar)
        except GrammarError as error:  # reply_format checked each schema: a limit of the whole
            param = "tools" if self.tool_names else "response_format"
            raise StructuredOutputError(param, f"the reply's grammar cannot be compiled: {error}") from None


def reply_format(
    response_format: Mapping[str, object] | None = None,
    tools: Sequence[Mapping[str, object]] | None = None,
    tool_choice: str | Mapping[str, object] | None = None,
    parallel_tool_calls: bool = True,
) -> ReplyFormat:
    """The :class:`ReplyFormat` a request's fields ask for, checked; raises
    :class:`StructuredOutputError` naming the field at fault."""
    reply = _reply_rule(response_format)
    schemas = _tool_schemas(tools or ())
    callable_tools = _chosen_tools(tool_choice, schemas)
    if not callable_tools:
        return ReplyFormat() if reply is None else ReplyFormat(f"start: reply\nreply: {reply}")
    forced = tool_choice is not None and tool_choice != "auto"
    several = parallel_tool_calls and not isinstance(tool_choice, Mapping)
    calls = calls_rules(callable_tools, several=several)
    if forced:
        grammar = f"start: calls\n{calls}"
    elif reply is None:
        grammar = f"start: TEXT | calls\n{TEXT_RULE}\n{calls}"
    else:
        grammar = f"start: reply | calls\nreply: {reply}\n{calls}"
    return ReplyFormat(grammar, tuple(callable_tools))


def _reply_rule(response_format: Mapping[str, object] | None) -> str | None:
    """The Lark body of a reply that is not a call (None: any text)."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise StructuredOutputError("response_format", _kinds_expected(response_format))
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_rule({"type": "object"})
    if kind != "json_schema":
        raise StructuredOutputError("response_format", _kinds_expected(kind))
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    if not isinstance(schema, Mapping):
        raise StructuredOutputError(
            "response_format",
            "response_format.json_schema.schema must be a JSON schema (an object), got "
            f"{_shown(schema)}: send {{'type': 'json_schema', 'json_schema': {{'name': ..., "
            "'schema': {...}}}}, or {'type': 'json_object'} for any JSON object",
        )
    return _checked_json_rule(schema, "response_format", "response_format.json_schema.schema")


def _kinds_expected(got: object) -> str:
    return f"response_format.type must be 'text', 'json_object' or 'json_schema', got {_shown(got)}"


def _tool_schemas(tools: Sequence[Mapping[str, object]]) -> dict[str, Mapping[str, object]]:
    """Each function tool's name → its parameters schema, checked."""
    if not isinstance(tools, Sequence) or isinstance(tools, str):
        raise StructuredOutputError("tools", f"tools must be a list of tools, got {_shown(tools)}")
    schemas: dict[str, Mapping[str, object]] = {}
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(tool, Mapping)
            or tool.get("type") != "function"
            or not isinstance(function, Mapping)
        ):
            raise StructuredOutputError(
                "tools",
                f"{where} must be {{'type': 'function', 'function': {{'name': ..., 'parameters': "
                f"{{...}}}}}}: function tools are the only kind served, got {_shown(tool)}",
            )
        name = function.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
            raise StructuredOutputError(
                "tools", f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {_shown(name)}"
            )
        if name in schemas:
            raise StructuredOutputError(
                "tools", f"{where}: two tools are named {name!r}; give each its own name"
            )
        parameters = function.get("parameters", _NO_PARAMETERS)
        if not isinstance(parameters, Mapping):
            raise StructuredOutputError(
                "tools",
                f"{where}.function.parameters must be a JSON schema (an object), got {_shown(parameters)}",
            )
        _checked_json_rule(parameters, "tools", f"{where}.function.parameters")
        schemas[name] = parameters
    return schemas


def _chosen_tools(
    tool_choice: str | Mapping[str, object] | None, schemas: dict[str, Mapping[str, object]]
) -> dict[str, Mapping[str, object]]:
    """The tools the reply may call under ``tool_choice`` (empty: none)."""
    if tool_choice is None:
        return schemas
    if tool_choice == "none":
        return {}
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise StructuredOutputError("tool_choice", _choices_expected(tool_choice))
        if name not in schemas:
            offered = ", ".join(map(repr, schemas)) or "none"
            raise StructuredOutputError(
                "tool_choice",
                f"tool_choice names the function {name!r}, which is not among the request's tools "
                f"({offered}): name one of them, or send the tool",
            )
        return {name: schemas[name]}
    if tool_choice not in ("auto", "required"):
        raise StructuredOutputError("tool_choice", _choices_expected(tool_choice))
    if not schemas and tool_choice == "required":
        raise StructuredOutputError(
            "tool_choice", "tool_choice 'required' needs tools: send the tools the model may call"
        )
    return schemas


def _choices_expected(got: object) -> str:
    return (
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': "
        f"{{'name': ...}}}}, got {_shown(got)}"
    )


def _checked_json_rule(schema: Mapping[str, object], param: str, where: str) -> str:
    """``schema``'s Lark rule, once the grammar library has accepted it."""
    rule = json_rule(schema)
    reason = _refusal(rule)
    if reason:
        raise StructuredOutputError(param, f"{where} cannot be enforced: {reason}")
    return rule


@functools.lru_cache(maxsize=256)
def _refusal(rule: str) -> str:
    """Why llguidance refuses ``rule`` ("" if it takes it); needs no tokenizer."""
    import llguidance  # the llm extra's: imported where a request asks for structure

    from .grammar import library_reason

    refused, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        llguidance.LLMatcher.grammar_from_lark(f"start: {rule}")
    )
    return library_reason(messages[0]) if refused else ""


def _shown(value: object) -> str:
    """``value`` in an error message, cut short."""
    text = (
        json.dumps(value)
        if isinstance(value, (dict, list, str, int, float, bool, type(None)))
        else repr(value)
    )
    return text if len(text) <= 80 else text[:77] + "..."
