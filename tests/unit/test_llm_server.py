"""The model server's pure parts: pieces held by the stream's pace sent as one chunk."""

from __future__ import annotations

from app_toolkit.llm.events import Delta
from app_toolkit.llm.replica.reply_stream import _joined


def test_held_tool_call_fragments_merge_by_index_with_their_text() -> None:
    first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
    held = [
        Delta(text="a"),
        Delta(tool_calls=(first, {"index": 0, "function": {"arguments": '{"x"'}})),
        Delta(tool_calls=({"index": 0, "function": {"arguments": ": 1}"}},)),
        Delta(
            tool_calls=(
                {
                    "index": 1,
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "g", "arguments": "{}"},
                },
            )
        ),
    ]
    joined = _joined(held, [], 5, (3, 4))
    assert joined.text == "a" and joined.completion_tokens == 5  # the tokens produced so far
    assert joined.tokens == (3, 4)  # the ids read since the last piece
    assert joined.tool_calls == (
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"index": 1, "id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    )
    assert first["function"] == {"name": "f", "arguments": ""}  # the fragments themselves unchanged
    alone = Delta(text="b", completion_tokens=6)
    assert _joined([alone], [], 7, (8,)) == Delta(text="b", completion_tokens=7, tokens=(8,))
