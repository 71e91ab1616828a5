"""Structured output: what a request's ``response_format`` (or vLLM's ``structured_outputs``),
``tools``, ``tool_choice`` and ``parallel_tool_calls`` allow its reply to be, as one grammar
enforced while decoding.

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
- vLLM's ``structured_outputs``, read as vLLM reads it: one of ``json`` (as
  ``json_schema``), ``json_object``, ``regex`` (text the regular expression matches whole),
  ``choice`` (one of the strings) or ``grammar`` (the client's own, Lark or GBNF, as vLLM's
  ``guidance`` backend takes it: the whole grammar of the reply);
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
from app_toolkit.llm.events import StructuredOutputs
from app_toolkit.llm.tool_calls import TEXT_RULE, calls_rules, json_rule

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

#: Function names OpenAI accepts.
_FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NO_PARAMETERS: Mapping[str, object] = {"type": "object", "properties": {}, "additionalProperties": False}
#: vLLM's kinds of ``structured_outputs``, of which a request names one (its
#: ``StructuredOutputsParams``: a kind set to null is not named).
_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
#: The kind each ``response_format`` type sets, as vLLM merges the two fields.
_FORMAT_KINDS = {"json_object": "json_object", "json_schema": "json"}
#: vLLM's options beside the kind, and their types. None changes a reply, in vLLM either:
#: its backends read the server's ``structured_outputs_config``, not the request's.
_OPTIONS: Mapping[str, type] = {
    "disable_any_whitespace": bool,
    "disable_additional_properties": bool,
    "whitespace_pattern": str,
}


class StructuredOutputError(AppToolkitError, ValueError):
    """A request's ``param`` cannot be enforced; ``message`` says why and what to send
    instead (the server answers 400 ``invalid_request_error`` naming ``param``, with
    ``code``)."""

    def __init__(self, param: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(param, message, code)

    @property
    def param(self) -> str:
        """The request field at fault (``response_format``, ``tools``, ``tool_choice``,
        ``structured_outputs.regex``...)."""
        return str(self.args[0])

    @property
    def code(self) -> str:
        """OpenAI's error code: ``invalid_value``, or ``unsupported_parameter``."""
        return str(self.args[2])

    @property
    def message(self) -> str:
        """What is wrong and how to fix it."""
        return str(self.args[1])

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class ReplyFormat:
    """What one request's replies may be: a grammar (llguidance's Lark syntax; None: free
    text) and the tools they may call (empty: the reply is never read for calls); ``source``
    is the field that asked for the grammar when no tool may be called
    (``structured_outputs.regex``...)."""

    grammar: str | None = None
    tool_names: tuple[str, ...] = ()
    source: str = "response_format"

    @property
    def field(self) -> str:
        """The request field that asked for a grammar: the one an engine that cannot
        enforce it refuses."""
        return "tool_choice" if self.tool_names else self.source.split(".")[0]

    def constraint(self, tokenizer: PreTrainedTokenizerFast | None) -> Constraint | None:
        """A new constraint for one reply over ``tokenizer`` (the engine's Hugging Face
        tokenizer); None when the reply is free text. One per reply: it holds the
        reply's position in the grammar."""
        if self.grammar is None:
            return None
        if tokenizer is None:
            raise StructuredOutputError(
                self.field,
                "this model's engine has no tokenizer to constrain its replies with: send the request "
                f"without {self.source.split('.')[0]} and tools, or serve a model that has one",
            )
        from .grammar import GrammarError, grammar_constraint  # torch: the model's replica only

        try:
            return grammar_constraint(tokenizer, self.grammar)
        except GrammarError as error:  # reply_format checked each schema: a limit of the whole
            param = "tools" if self.tool_names else self.source
            raise StructuredOutputError(param, f"the reply's grammar cannot be compiled: {error}") from None


@dataclass(frozen=True, slots=True)
class _Reply:
    """What a reply that is not a tool call may be, as the field ``source`` asks: a Lark
    rule's body (``rule``), a whole grammar of the client's (``grammar``), or any text."""

    source: str
    rule: str | None = None
    grammar: str | None = None

    def alone(self) -> ReplyFormat:
        """The format of a reply that may call no tool."""
        if self.grammar is not None:
            return ReplyFormat(self.grammar, source=self.source)
        if self.rule is None:
            return ReplyFormat()
        return ReplyFormat(f"start: reply\nreply: {self.rule}", source=self.source)


def reply_format(
    response_format: Mapping[str, object] | StructuredOutputs | None = None,
    tools: Sequence[Mapping[str, object]] | None = None,
    tool_choice: str | Mapping[str, object] | None = None,
    parallel_tool_calls: bool = True,
) -> ReplyFormat:
    """The :class:`ReplyFormat` a request's fields ask for, checked; raises
    :class:`StructuredOutputError` naming the field at fault. ``response_format`` is the
    request's, or vLLM's ``structured_outputs`` with it (``events.reply_format_asked``)."""
    if isinstance(response_format, StructuredOutputs):
        reply = _structured_outputs_reply(response_format, tool_choice)
    else:
        reply = _Reply("response_format", _reply_rule(response_format))
    schemas = _tool_schemas(tools or ())
    callable_tools = _chosen_tools(tool_choice, schemas)
    if not callable_tools:
        return reply.alone()
    forced = tool_choice is not None and tool_choice != "auto"
    several = parallel_tool_calls and not isinstance(tool_choice, Mapping)
    calls = calls_rules(callable_tools, several=several)
    if forced:  # a call, whatever else was asked (vLLM's tool parsers replace it too)
        grammar = f"start: calls\n{calls}"
    elif reply.grammar is not None:  # its rules' names are the client's: no room for calls
        raise StructuredOutputError(
            reply.source,
            f"{reply.source} cannot be combined with tools the model may call: send tool_choice "
            "'none' (or 'required' for a call), or leave out the tools",
        )
    elif reply.rule is None:
        grammar = f"start: TEXT | calls\n{TEXT_RULE}\n{calls}"
    else:
        grammar = f"start: reply | calls\nreply: {reply.rule}\n{calls}"
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


def _structured_outputs_reply(asked: StructuredOutputs, tool_choice: object) -> _Reply:
    """The reply vLLM's ``structured_outputs`` asks for, checked as vLLM checks it: one kind
    named; beside a ``response_format`` (not ``text``), the same kind, which
    ``response_format`` then sets; no ``json``, ``regex`` or ``choice`` with a named
    ``tool_choice``."""
    given = asked.given
    named = [kind for kind in _KINDS if given.get(kind) is not None]
    if len(named) != 1:
        raise StructuredOutputError(
            "structured_outputs",
            f"structured_outputs takes one kind of constraint ({', '.join(_KINDS)}), got "
            f"{' and '.join(named) or 'none'}: send one",
        )
    kind = named[0]
    for option, option_type in _OPTIONS.items():
        value = given.get(option)
        if value is not None and not isinstance(value, option_type):
            expected = "a boolean" if option_type is bool else "a string"
            raise StructuredOutputError(
                f"structured_outputs.{option}",
                f"structured_outputs.{option} must be {expected}, got {_shown(value)}",
            )
    if isinstance(tool_choice, Mapping) and kind in ("json", "regex", "choice"):
        raise StructuredOutputError(
            "structured_outputs",
            f"structured_outputs.{kind} and a named tool_choice both say what the reply is: send "
            "one (with tool_choice 'none', 'auto' or 'required', structured_outputs is taken)",
        )
    response_format = asked.response_format
    if response_format is not None and response_format.get("type") != "text":
        rule = _reply_rule(response_format)  # checked as without structured_outputs
        if _FORMAT_KINDS.get(str(response_format.get("type"))) != kind:
            raise StructuredOutputError(
                "structured_outputs",
                f"structured_outputs.{kind} and response_format {_shown(response_format.get('type'))} "
                "both say what the reply is: send one of them",
            )
        return _Reply("response_format", rule)  # vLLM's response_format sets the kind they share
    return _kind_reply(kind, given[kind])


def _kind_reply(kind: str, value: object) -> _Reply:
    """The reply of one kind of ``structured_outputs`` (``value``: the client's, not null)."""
    param = f"structured_outputs.{kind}"
    if kind == "json":
        return _Reply(param, _checked_json_rule(_schema_of(value, param), param, param))
    if kind == "json_object":
        if value is not True:
            raise StructuredOutputError(param, f"{param} must be true (or left out), got {_shown(value)}")
        return _Reply(param, json_rule({"type": "object"}))
    if kind == "regex":
        if not isinstance(value, str):
            raise StructuredOutputError(
                param, f"{param} must be a regular expression (a string), got {_shown(value)}"
            )
        import llguidance  # the llm extra's: imported where a request asks for structure

        # Lark's /.../ as llguidance writes a regex grammar (Rust's regex syntax, Unicode).
        return _Reply(param, _checked_rule(f"/{llguidance.regex_to_lark(value, '')}/", param))
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(one, str) for one in value):
            raise StructuredOutputError(
                param, f"{param} must be a list of strings (the reply is one of them), got {_shown(value)}"
            )
        return _Reply(param, _checked_rule(" | ".join(json.dumps(one) for one in value), param))
    if kind == "grammar":
        return _Reply(param, grammar=_checked_grammar(value, param))
    raise StructuredOutputError(
        param,
        f"{param} is not supported by this server: send tools for tool calls, or "
        "structured_outputs.json for a JSON document",
        "unsupported_parameter",
    )


def _schema_of(value: object, param: str) -> Mapping[str, object]:
    """A JSON schema given as an object or as its JSON text (vLLM takes both)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as error:
            raise StructuredOutputError(param, f"{param} is not JSON: {error}") from None
    if not isinstance(value, Mapping):
        raise StructuredOutputError(param, f"{param} must be a JSON schema (an object), got {_shown(value)}")
    return value


def _checked_grammar(value: object, param: str) -> str:
    """The client's grammar as llguidance's Lark (GBNF converted, as vLLM's ``guidance``
    backend converts it), once llguidance has accepted it."""
    if not isinstance(value, str) or not value.strip():
        raise StructuredOutputError(
            param, f"{param} must be a grammar (Lark or GBNF text), got {_shown(value)}"
        )
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(value)
    except Exception as error:  # noqa: BLE001  # its GBNF reader raises bare Exception too
        raise StructuredOutputError(param, f"{param} cannot be read as Lark or GBNF: {error}") from None
    reason = _refusal(lark)
    if reason:
        from .grammar import library_reason

        raise StructuredOutputError(
            param, f"{param} cannot be enforced: {library_reason(reason, positions=True)}"
        )
    return lark


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
    return _checked_rule(json_rule(schema), param, where)


def _checked_rule(rule: str, param: str, where: str = "") -> str:
    """``rule`` (a Lark rule's body), once the grammar library has accepted it."""
    reason = _refusal(f"start: {rule}")
    if reason:
        from .grammar import library_reason

        raise StructuredOutputError(param, f"{where or param} cannot be enforced: {library_reason(reason)}")
    return rule


@functools.lru_cache(maxsize=256)
def _refusal(grammar: str) -> str:
    """llguidance's message refusing ``grammar`` (Lark; "" if it takes it); needs no tokenizer."""
    import llguidance  # the llm extra's: imported where a request asks for structure

    refused, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        llguidance.LLMatcher.grammar_from_lark(grammar)
    )
    return messages[0] if refused else ""


def _shown(value: object) -> str:
    """``value`` in an error message, cut short."""
    text = (
        json.dumps(value)
        if isinstance(value, (dict, list, str, int, float, bool, type(None)))
        else repr(value)
    )
    return text if len(text) <= 80 else text[:77] + "..."
