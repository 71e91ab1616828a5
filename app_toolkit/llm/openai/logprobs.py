"""A reply's log-probabilities in OpenAI's shapes, as vLLM's server writes them: chat's
``logprobs.content`` (a token, its bytes and the likeliest tokens each), and the legacy
completions' four lists (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``)."""

from __future__ import annotations

from collections.abc import Sequence

from app_toolkit.llm.events import TokenLogprob
from app_toolkit.llm.openai_shapes import ChatLogprobs, CompletionLogprobs, TopLogprob


def chat(entries: Sequence[TokenLogprob]) -> ChatLogprobs:
    """Chat's ``logprobs`` of ``entries``."""
    return {
        "content": [
            {
                **_token(entry.token, entry.logprob, entry.raw),
                "top_logprobs": [_token(text, logprob, raw) for text, logprob, raw in entry.top],
            }
            for entry in entries
        ]
    }


def _token(text: str, logprob: float, raw: bytes) -> TopLogprob:
    """One token: ``bytes`` are the token's own (part of a character, for some), as OpenAI
    gives them; vLLM gives its text's, encoded."""
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


def completion(entries: Sequence[TokenLogprob], offset: int) -> CompletionLogprobs:
    """The completions' ``logprobs`` of ``entries``, whose text starts ``offset``
    characters into the choice's text (after what came before: an echo, earlier chunks)."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "text_offset": offsets,
        "token_logprobs": [entry.logprob for entry in entries],
        "tokens": [entry.token for entry in entries],
        # The token itself first, then the likeliest (up to logprobs + 1 entries), as vLLM's.
        "top_logprobs": [
            {entry.token: entry.logprob, **{text: logprob for text, logprob, _ in entry.top}}
            for entry in entries
        ],
    }
