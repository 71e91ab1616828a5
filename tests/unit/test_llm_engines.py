"""The echo engine (tokens, pace, limits, constraints) and the detokenizer every engine
user streams through (characters split across tokens, stop strings across pieces)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest

from app_toolkit.llm.detokenize import Detokenizer, StopFilter
from app_toolkit.llm.engine import EngineLoad, EngineRequest, Sampling, TextEngine
from app_toolkit.llm.engines import make_engine
from app_toolkit.llm.engines.echo import EOS_ID, VOCAB_SIZE, EchoEngine
from app_toolkit.llm.engines.hf_tokenizer import TokenizerText

FAST = EchoEngine(tokens_per_s=100_000)


async def _reply(
    engine: EchoEngine, prompt: list[int], sampling: Sampling, constraint: object = None
) -> list[int]:
    request = EngineRequest(prompt, sampling, constraint)  # type: ignore[arg-type]  # a stand-in constraint
    return [token.id async for token in engine.generate(request) if not token.ends]


def reply(
    prompt: list[int], sampling: Sampling, constraint: object = None, engine: EchoEngine = FAST
) -> list[int]:
    return asyncio.run(_reply(engine, prompt, sampling, constraint))


def test_the_echo_engine_tokenizes_bytes_and_echoes_the_last_user_message() -> None:
    engine: TextEngine = make_engine("echo", context_window=64)
    assert isinstance(engine, EchoEngine) and engine.context_window == 64 and engine.slots == 0
    assert engine.encode("hé") == [104, 0xC3, 0xA9] and engine.decode([104, 0xC3, 0xA9, EOS_ID]) == "hé"
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "again"},
    ]
    prompt = engine.chat_prompt(messages)
    assert prompt == list(b"again")
    assert FAST.decode(reply(prompt, Sampling(max_tokens=100))) == "again"


def test_the_echo_engine_honours_max_tokens_stop_ids_and_ignore_eos() -> None:
    prompt = list(b"hello")
    assert reply(prompt, Sampling(max_tokens=3)) == list(b"hel")
    assert reply(prompt, Sampling(max_tokens=0)) == []
    assert reply(prompt, Sampling(max_tokens=100, stop_token_ids=(ord("l"),))) == list(b"he")
    assert reply(prompt, Sampling(max_tokens=12, ignore_eos=True)) == list(b"hellohellohe")
    assert reply(prompt + [EOS_ID, ord("x")], Sampling(max_tokens=100)) == prompt  # the EOS ends it

    async def every(sampling: Sampling) -> list[tuple[int, bool]]:
        return [(token.id, token.ends) async for token in FAST.generate(EngineRequest(prompt, sampling))]

    # The token that ended it comes last, marked: counted in usage, never shown.
    stopped = asyncio.run(every(Sampling(max_tokens=100, stop_token_ids=(ord("l"),))))
    assert stopped == [(ord("h"), False), (ord("e"), False), (ord("l"), True)]


class Only:
    """A toy constraint: only ``tokens`` may come; finished after ``length`` tokens."""

    grammar = ""  # no text: only this test's engines read it, through allowed()

    def __init__(self, tokens: set[int], length: int = 1000) -> None:
        self.tokens, self.length = tokens, length
        self.accepted: list[int] = []

    def allowed(self, vocab_size: int) -> list[bool]:
        assert vocab_size == VOCAB_SIZE
        return [token in self.tokens for token in range(vocab_size)]

    def accept(self, token_id: int) -> None:
        assert token_id in self.tokens
        self.accepted.append(token_id)

    @property
    def finished(self) -> bool:
        return len(self.accepted) >= self.length


def test_the_echo_engine_replaces_a_token_the_constraint_refuses_by_the_lowest_allowed() -> None:
    digits = Only({ord(d) for d in "0123456789"} | {ord("b")})
    tokens = reply(list(b"a1b2"), Sampling(max_tokens=100), digits)
    assert bytes(tokens) == b"01b2" and digits.accepted == tokens  # "a" is refused: the lowest, "0"
    short = Only({ord("x"), ord("y")}, length=2)
    assert bytes(reply(list(b"xyxyxy"), Sampling(max_tokens=100), short)) == b"xy"  # finished ends it
    assert reply(list(b"abc"), Sampling(max_tokens=100), Only(set())) == []  # nothing allowed: the end


def test_the_echo_engine_keeps_a_steady_pace_that_does_not_drift() -> None:
    engine = EchoEngine(tokens_per_s=200)  # 5 ms a token

    async def timed() -> tuple[list[float], EngineLoad]:
        started = time.monotonic()
        stamps = []
        reply = engine.generate(EngineRequest(list(b"x" * 40), Sampling(max_tokens=40)))
        assert isinstance(reply, AsyncGenerator)
        async for _ in reply:
            stamps.append(time.monotonic() - started)
            if len(stamps) == 10:
                load = engine.current_load()
                time.sleep(0.1)  # the loop stalls: the next tokens catch up, the schedule holds
        return stamps, load

    stamps, load = asyncio.run(timed())
    assert load == EngineLoad.of(0, (30,))  # max_tokens 40, 10 sent
    assert engine.current_load() == EngineLoad.of(0, ())
    assert stamps[0] >= 0.004 and stamps[9] >= 0.045  # a pace, not a burst
    assert 0.195 <= stamps[-1] < 0.28  # 40 tokens at 5 ms: the 100 ms stall was caught up


def test_closing_an_echo_reply_frees_it_at_once() -> None:
    engine = EchoEngine(tokens_per_s=100)

    async def scenario() -> None:
        reply = engine.generate(EngineRequest(list(b"abcdef"), Sampling(max_tokens=6)))
        assert isinstance(reply, AsyncGenerator)
        assert (await anext(reply)).id == ord("a")
        assert engine.current_load().remaining == (5,)
        await reply.aclose()
        assert engine.current_load() == EngineLoad.of(0, ())

    asyncio.run(scenario())


def test_the_engine_names_are_checked() -> None:
    with pytest.raises(ValueError, match="choose one of vllm, transformers, echo, embeddings"):
        make_engine("llama.cpp")


def _pieces(tokens: Sequence[int], context: Sequence[int] = ()) -> list[str]:
    detokenizer = Detokenizer(FAST.decode, context)
    pieces = [detokenizer.feed(token) for token in tokens]
    return [*pieces, detokenizer.flush()]


def test_a_character_split_across_tokens_waits_for_its_last_byte() -> None:
    text = "aé€😀b"
    pieces = _pieces(list(text.encode()))
    assert "".join(pieces) == text and all("\ufffd" not in piece for piece in pieces)
    assert pieces[:4] == ["a", "", "é", ""]  # é is two bytes: nothing after the first
    assert pieces[-1] == ""  # nothing held at the end


def test_a_reply_cut_inside_a_character_ends_with_the_replacement_character() -> None:
    assert "".join(_pieces([ord("a"), 0xE2, 0x82])) == "a\ufffd"
    assert _pieces([0xE2, 0x82]) == ["", "", "\ufffd"]


def test_the_detokenizer_decodes_a_window_not_the_whole_reply() -> None:
    decoded: list[int] = []

    def decode(tokens: Sequence[int]) -> str:
        decoded.append(len(tokens))
        return FAST.decode(tokens)

    detokenizer = Detokenizer(decode, context=list(b"prompt"))
    assert "".join(detokenizer.feed(token) for token in b"x" * 500) == "x" * 500
    assert max(decoded) <= 6 + 1  # the context and the first token; then two tokens at a time


def test_stop_strings_are_found_across_pieces_and_what_may_begin_one_is_held() -> None:
    stops = StopFilter(["END", "\n\n"])
    assert stops.feed("hello E") == "hello "  # "E" may begin "END"
    assert stops.feed("xtra\n") == "Extra"  # it did not; "\n" may begin "\n\n"
    assert stops.feed("more") == "\nmore"
    assert stops.feed(" E") == " " and stops.feed("N") == "" and not stops.stopped
    assert stops.feed("D and after") == "" and stops.stopped
    assert stops.feed("more") == "" and stops.flush() == ""

    unstopped = StopFilter(["STOP"])
    assert unstopped.feed("a ST") == "a " and unstopped.flush() == "ST"  # held text ends the stream
    assert StopFilter([]).feed("anything") == "anything"

    # Of two stop strings in one piece, the one that ends first (ties: the first listed), as vLLM.
    first = StopFilter(["b", "abc"])
    assert first.feed("abc") == "a" and first.found == "b"
    tied = StopFilter(["cd", "bcd"])
    assert tied.feed("abcde") == "ab" and tied.found == "cd"  # both end at 4: the first listed
    kept = StopFilter(["END"], include=True)  # vLLM's include_stop_str_in_output
    assert kept.feed("one E") == "one " and kept.feed("ND two") == "END" and kept.stopped
    assert kept.found == "END" and kept.feed("more") == "" and kept.flush() == ""


def test_the_words_tokenizer_counts_words_with_their_spaces() -> None:
    engine = EchoEngine(tokens_per_s=100_000, tokenizer="words")
    prompt = engine.chat_prompt([{"role": "user", "content": "hello brave  new hello "}])
    assert len(prompt) == 4 and prompt[0] == prompt[3] and 0 not in prompt  # one id per word
    tokens = reply(prompt, Sampling(max_tokens=3), engine=engine)
    assert [engine.decode([token]) for token in tokens] == ["hello ", "brave  ", "new "]
    assert engine.decode(engine.encode("  lead, and trail ")) == "  lead, and trail "
    assert engine.decode([0, *prompt]) == "hello brave  new hello "  # 0 ends a sequence: no text
    with pytest.raises(ValueError, match="not one of bytes, words"):
        EchoEngine(tokenizer="letters")  # type: ignore[arg-type]


class _Template:
    """A tokenizer's chat template, as TokenizerText calls it: what it was given."""

    def __init__(self) -> None:
        self.given: dict[str, Any] = {}

    def apply_chat_template(self, messages: list[dict[str, Any]], **arguments: Any) -> list[int]:
        self.given = arguments
        return [len(messages)]


def test_a_requests_template_variables_reach_the_template_but_never_the_servers_own() -> None:
    text = TokenizerText()
    text.tokenizer = template = _Template()
    messages = [{"role": "user", "content": "hi"}]
    assert text.chat_prompt(messages, None, {"enable_thinking": False, "tokenize": False}) == [1]
    shape = {"add_generation_prompt": True, "continue_final_message": False, "tokenize": True}
    assert template.given == {**shape, "enable_thinking": False}
    tools = [{"type": "function", "function": {"name": "f"}}]
    text.chat_prompt(messages, tools, {"tools": [], "chat_template": "{{ 'x' }}"})
    assert template.given == {**shape, "tools": tools}
    text.chat_prompt(messages, add_generation_prompt=False, continue_final_message=True)  # a prefill
    assert template.given == {**shape, "add_generation_prompt": False, "continue_final_message": True}
