"""Tool calls in a reply: the format a constrained model writes them in, the grammar that
holds it to that format, and the parser that turns the text into OpenAI's ``tool_calls`` —
whole, or as ``delta.tool_calls`` fragments while the reply streams.

The format is Hermes' (Qwen's and SmolLM3's chat templates teach the same), one block per
call, blocks separated by a newline::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}
    </tool_call>

The JSON is compact, with ``", "`` and ``": "`` between items (Python's ``json.dumps``
layout): the grammar allows no other whitespace, so a small model cannot wander into
blank lines, and the block holds no raw newline, so the parser needs no lookahead. The
name is one of the request's tools and ``arguments`` follows that tool's ``parameters``
schema. A reply holds either text or calls, decided by its first characters: text may
not start with ``<tool_call>``, and once it has, the reply can only end after a whole call
(the end-of-sequence token is masked until then). A reply cut by ``max_tokens`` may
still end mid-call; its last call then carries the arguments written so far (OpenAI's
answer to a cut call, with ``finish_reason`` ``length``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .openai_shapes import ToolCall

#: Opens a call block.
CALL_OPEN = "<tool_call>\n"
#: Closes a call block (after the call's JSON object).
CALL_CLOSE = "\n</tool_call>"
#: Between two call blocks.
CALL_SEPARATOR = "\n"
#: llguidance's JSON options for every document it constrains: compact, fixed separators.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
#: Text that is not a call (the reply's other choice when tool_choice is "auto").
TEXT_RULE = "TEXT: /(?s:.*)/ & ~/" + CALL_OPEN.replace("\n", "\\n") + "(?s:.*)/"

_NAME_PREFIX = '{"name": "'
_ARGUMENTS_PREFIX = '", "arguments": '
_CALL_END = "}" + CALL_CLOSE


def json_rule(schema: Mapping[str, object]) -> str:
    """llguidance's Lark body for a JSON document that follows ``schema``, in the compact
    layout (``JSON_LAYOUT`` overrides any ``x-guidance`` the schema carries)."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def calls_rules(tools: Mapping[str, Mapping[str, object]], *, several: bool) -> str:
    """Lark rules defining ``calls``: one call block (``several``: one or more) to a tool
    of ``tools`` (name → its ``parameters`` schema)."""
    alternatives, rules = [], []
    for index, (name, parameters) in enumerate(tools.items()):
        head = CALL_OPEN + _NAME_PREFIX + name + _ARGUMENTS_PREFIX
        alternatives.append(f"{json.dumps(head)} arguments_{index} {json.dumps(_CALL_END)}")
        rules.append(f"arguments_{index}: {json_rule(parameters)}")
    calls = f"calls: call ({json.dumps(CALL_SEPARATOR)} call)*" if several else "calls: call"
    return "\n".join([calls, "call: " + "\n    | ".join(alternatives), *rules])


def tool_instructions(tools: Sequence[Mapping[str, object]]) -> str:
    """System-prompt text for a model whose chat template has no tools: the request's
    ``tools`` (OpenAI's list, as ``reply_format`` checked it) and how to write a call. The
    grammar enforces the format either way; a model that has read it is likelier to call
    when a call is its choice (``tool_choice`` ``"auto"``)."""
    listed = "\n".join(json.dumps(tool["function"]) for tool in tools)
    example = CALL_OPEN + '{"name": <function name>, "arguments": <arguments object>}' + CALL_CLOSE
    return f"You may call these functions:\n{listed}\nTo call one, reply with only:\n{example}"


def new_call_id() -> str:
    """A tool call id in OpenAI's shape (``call_`` and 24 random characters)."""
    return "call_" + secrets.token_hex(12)


#: One fragment of ``delta.tool_calls`` (OpenAI's ChoiceDeltaToolCall, as JSON): the
#: first of a call ``{"index", "id", "type", "function": {"name", "arguments": ""}}``,
#: the next ``{"index", "function": {"arguments": <a piece>}}``. A plain JSON object, as
#: ``Delta.tool_calls`` (events.py) carries it.
Fragment = dict[str, Any]


class ToolCallStream:
    """Reads a reply's text as it arrives and returns what to send: content text and
    ``delta.tool_calls`` fragments.

    The first fragment of a call carries its ``index``, ``id``, ``type`` and
    ``function.name`` (with empty ``arguments``); later ones carry ``index`` and pieces of
    ``function.arguments``, which concatenate to the arguments' JSON text. Text that
    could still become a call (a prefix of ``<tool_call>``) is held back until it cannot.
    Text that leaves the format (it was not generated under the grammar) is passed on as
    content.
    """

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        self._new_id = new_id
        self._mode = "start"  # then "text" or "calls"
        self._held = ""  # start: the text so far; calls: the part of _expect matched
        self._part = "literal"  # calls: literal, name or arguments
        self._expect = CALL_OPEN + _NAME_PREFIX  # literal: what must come next
        self._after = "name"  # literal: the part after it
        self._name = ""
        self._depth = 0  # arguments: nesting depth of objects and arrays
        self._in_string = False
        self._escaped = False
        #: Calls begun so far (a reply with any ends with finish_reason "tool_calls").
        self.calls = 0

    def feed(self, text: str) -> tuple[str, list[Fragment]]:
        """Content and fragments for the next piece of the reply's text."""
        if self._mode == "start":
            self._held += text
            if CALL_OPEN.startswith(self._held):
                return "", []
            text, self._held = self._held, ""
            self._mode = "calls" if text.startswith(CALL_OPEN) else "text"
        if self._mode == "text":
            return text, []
        return self._feed_calls(text)

    def finish(self) -> tuple[str, list[Fragment]]:
        """What is still held back when the reply ends: text that began like a call."""
        if self._mode == "start":
            held, self._held, self._mode = self._held, "", "text"
            return held, []
        return "", []

    def _feed_calls(self, text: str) -> tuple[str, list[Fragment]]:
        fragments: list[Fragment] = []
        arguments_from = 0 if self._part == "arguments" else -1  # where this piece's arguments begin
        for position, char in enumerate(text):
            if self._part == "arguments":
                if self._arguments_end(char):
                    fragments.append(self._arguments_fragment(text[arguments_from : position + 1]))
                    arguments_from = -1
                    self._literal(_CALL_END + CALL_SEPARATOR + CALL_OPEN + _NAME_PREFIX, "name")
            elif self._part == "name":
                if char != '"':
                    self._name += char
                    continue
                fragments.append(self._first_fragment())
                self._literal(_ARGUMENTS_PREFIX[1:], "arguments")
            elif char == self._expect[len(self._held)]:
                self._held += char
                if len(self._held) == len(self._expect):
                    self._part, self._held = self._after, ""
                    if self._part == "arguments":
                        arguments_from, self._depth, self._in_string = position + 1, 0, False
            else:  # off the format: the rest is text (less the end of a call it follows)
                self._mode = "text"
                held, self._held = self._held, ""
                if held.startswith(_CALL_END) and self._after == "name":
                    held = held[len(_CALL_END) :]
                return held + text[position:], fragments
        if arguments_from >= 0 and arguments_from < len(text):
            fragments.append(self._arguments_fragment(text[arguments_from:]))
        return "", fragments

    def _literal(self, expect: str, after: str) -> None:
        self._part, self._expect, self._after, self._held = "literal", expect, after, ""

    def _arguments_end(self, char: str) -> bool:
        """Follow the arguments' JSON one character at a time; True at its last one."""
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
        elif char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
        return self._depth == 0 and not self._in_string

    def _first_fragment(self) -> Fragment:
        self.calls += 1
        name, self._name = self._name, ""
        return {
            "index": self.calls - 1,
            "id": self._new_id(),
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }

    def _arguments_fragment(self, piece: str) -> Fragment:
        return {"index": self.calls - 1, "function": {"arguments": piece}}


def merge_fragments(fragments: list[Fragment]) -> list[ToolCall]:
    """Whole ``tool_calls`` from streamed fragments (arguments pieces joined per index),
    as a client assembles them."""
    calls: dict[int, ToolCall] = {}
    for fragment in fragments:
        index = fragment["index"]
        if index not in calls:
            calls[index] = {
                "id": fragment["id"],
                "type": "function",
                "function": {"name": fragment["function"]["name"], "arguments": ""},
            }
        calls[index]["function"]["arguments"] += fragment["function"].get("arguments", "")
    return [calls[index] for index in sorted(calls)]


def parse_tool_calls(text: str, new_id: Callable[[], str] = new_call_id) -> tuple[str | None, list[ToolCall]]:
    """A whole reply's content (None when it is only calls) and its ``tool_calls`` in
    OpenAI's shape; the same reading as :class:`ToolCallStream`'s."""
    stream = ToolCallStream(new_id)
    content, fragments = stream.feed(text)
    rest, more = stream.finish()
    content += rest
    calls = merge_fragments(fragments + more)
    return (content or None) if calls else content, calls
