"""A reply's log-probabilities in OpenAI's shapes, as vLLM's server writes them."""

from __future__ import annotations

from app_toolkit.llm.events import TokenLogprob
from app_toolkit.llm.openai import logprobs

ENTRIES = (
    TokenLogprob(" Par", -0.25, b" Par", ((" Par", -0.25, b" Par"), (" Lyon", -2.0, b" Lyon"))),
    TokenLogprob("\ufffd", -0.5, b"\xc3", (("\ufffd", -0.5, b"\xc3"), ("e", -1.5, b"e"))),
)


def test_chat_logprobs_carry_each_token_its_bytes_and_the_likeliest() -> None:
    assert logprobs.chat(ENTRIES)["content"] == [
        {
            "token": " Par",
            "logprob": -0.25,
            "bytes": [32, 80, 97, 114],
            "top_logprobs": [
                {"token": " Par", "logprob": -0.25, "bytes": [32, 80, 97, 114]},
                {"token": " Lyon", "logprob": -2.0, "bytes": [32, 76, 121, 111, 110]},
            ],
        },
        {  # half a character: its bytes say which half
            "token": "\ufffd",
            "logprob": -0.5,
            "bytes": [195],
            "top_logprobs": [
                {"token": "\ufffd", "logprob": -0.5, "bytes": [195]},
                {"token": "e", "logprob": -1.5, "bytes": [101]},
            ],
        },
    ]
    assert logprobs.chat(()) == {"content": []}


def test_completion_logprobs_are_four_lists_with_offsets_into_the_text() -> None:
    assert logprobs.completion(ENTRIES, offset=3) == {
        "text_offset": [3, 7],
        "token_logprobs": [-0.25, -0.5],
        "tokens": [" Par", "\ufffd"],
        "top_logprobs": [{" Par": -0.25, " Lyon": -2.0}, {"\ufffd": -0.5, "e": -1.5}],
    }
    # The token itself always comes first, the likeliest after it (vLLM's logprobs + 1).
    drawn = TokenLogprob(" Nice", -3.0, b" Nice", ((" Par", -0.25, b" Par"),))
    assert logprobs.completion([drawn], offset=0)["top_logprobs"] == [{" Nice": -3.0, " Par": -0.25}]
    assert logprobs.completion([TokenLogprob("a", -0.1, b"a")], offset=0) == {
        "text_offset": [0],
        "token_logprobs": [-0.1],
        "tokens": ["a"],
        "top_logprobs": [{"a": -0.1}],
    }
