"""A model's server in the test's process on a given engine, and a reply cut after one of
its pieces and continued from the pieces before the cut (``LLMServer.generate`` is
``@continuable``): for tests of continuation on each engine without Ray or HTTP, and the
greedy replies each engine's test cuts where a replica's death loses the most."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from app_toolkit.llm import LLMConfig, LLMServer
from app_toolkit.llm.engine import Sampling, TextEngine
from app_toolkit.llm.events import Delta, Generation, TokenLogprob
from app_toolkit.llm.replica.continued import continue_generation

_GREEDY = Sampling(max_tokens=20, temperature=0, ignore_eos=True)
#: Greedy replies of SmolLM2 whose pieces hold what a reader of single tokens would lose,
#: and the kinds of cut each must offer (``check_cut_reply``): characters of several
#: tokens; text held back for two stop strings that overlap, one partly met, then the
#: other met; and a completion of two prompts (two choices) of emoji, three tokens each,
#: with log-probabilities.
CUT_REPLIES = {
    "characters of several tokens": (
        Generation(_GREEDY, prompt="日本語の文章: 東京は日本の首都です。東京は"),
        {"several tokens"},
    ),
    "stop strings held back": (
        Generation(
            _GREEDY, prompt="Les crèmes brûlées à la française: ", stops=("de la bresse", "crème de lait")
        ),
        {"held"},
    ),
    "two choices with log-probabilities": (
        Generation(
            dataclasses.replace(_GREEDY, max_tokens=16, logprobs=1),
            prompts=("Emoji story: 🌊🏠🌊🏠🌊🏠", "Emoji weather: 🌧🌈🌧🌈🌧🌈"),
        ),
        {"several tokens"},
    ),
}

#: The server's own configuration: the engine is the test's.
_CONFIG: dict[str, object] = {"model_loading_config": {"model_id": "e"}, "llm_engine": "echo"}


class _Server(LLMServer):
    def __del__(self) -> None:  # type: ignore[override]  # the engine is the test's to close
        pass


async def server_on(engine: TextEngine) -> LLMServer:
    """A model's server whose replies come from ``engine`` (its test closes it)."""
    server = _Server.__new__(_Server)
    await server.__init__(LLMConfig.model_validate(_CONFIG))  # type: ignore[misc]  # an async constructor
    await server._engine.close()
    server._engine = engine
    return server


async def whole(server: LLMServer, generation: Generation) -> list[Delta]:
    """The reply's pieces, unbroken."""
    return [piece async for piece in server.generate(generation)]


async def continued(server: LLMServer, generation: Generation, had: Sequence[Delta]) -> list[Delta]:
    """The pieces ``had`` (the prompt's count first), then the rest of the reply as a
    continuation from them makes it."""
    rest = [piece async for piece in server.generate(continue_generation(generation, had))]
    # The prompt is counted once: no second counting piece (only finishes repeat it).
    assert all(piece.finish_reason is not None or piece.prompt_tokens == 0 for piece in rest)
    return [*had, *rest]


def replies(pieces: Sequence[Delta], count: int) -> list[tuple[object, ...]]:
    """Each of ``count`` choices as its client reads it: text, tool calls, log-probabilities,
    finish, usage and stop reason."""
    made: list[tuple[object, ...]] = []
    for index in range(count):
        mine = [piece for piece in pieces if piece.index == index and piece is not pieces[0]]
        last = [piece for piece in mine if piece.finish_reason is not None]
        assert len(last) == 1  # one finish per choice
        made.append(
            (
                "".join(piece.text for piece in mine),
                [fragment for piece in mine for fragment in piece.tool_calls],
                [logprob for piece in mine for logprob in piece.logprobs],
                last[0].finish_reason,
                last[0].completion_tokens,
                last[0].stop_reason,
            )
        )
    return made


async def check_cut_reply(
    server: LLMServer,
    generation: Generation,
    kinds: set[str],
    decode: Callable[[list[int]], str],
    logprobs_within: float,
) -> None:
    """``generation``'s reply, cut where a replica's death loses the most and continued,
    is the unbroken reply. Cut before a piece of "several tokens" (the lost replica had
    read part of its character, or of the text a stop string holds back), and after a
    piece that "held" text back (its tokens sent, their text not: ``decode`` tells; one
    choice only; with stop strings, text that starts one); of each kind the first and the
    last, which the reply must offer for each of ``kinds``, in each choice. A reply with
    stop strings must end on the first; choices must differ. Log-probabilities, one
    per token, are compared ``logprobs_within`` (a real model's float arithmetic varies a
    little between runs: on the transformers engine, two unbroken replies' differ by about
    0.000002)."""
    count = max(1, len(generation.prompts)) * generation.n
    pieces = await whole(server, generation)
    shown = [(piece.index, piece.text, piece.tokens) for piece in pieces]
    found: dict[str, list[int]] = {"several tokens": [], "held": []}
    sent, read = "", list[int]()
    for at in range(1, len(pieces) - 1):  # a cut keeps pieces[:cut]: the first counts the prompt
        piece = pieces[at]
        if len(piece.tokens) > 1:
            found["several tokens"].append(at)
        if count > 1:
            continue
        sent, read = sent + piece.text, [*read, *piece.tokens]
        full = decode(read)
        assert full.startswith(sent), (full, sent)  # what was sent is what the tokens say
        held = full[len(sent) :]
        if held and (not generation.stops or any(stop.startswith(held) for stop in generation.stops)):
            found["held"].append(at + 1)
    for kind in kinds:
        assert {pieces[at].index for at in found[kind]} == set(range(count)), (kind, found, shown)
    cuts = sorted({1} | {at for ats in found.values() if ats for at in (ats[0], ats[-1])})
    unbroken = replies(pieces, count)
    assert len({choice[0] for choice in unbroken}) == count, shown
    if generation.stops:
        ends = [choice[3:] for choice in unbroken]
        assert ends == [("stop", unbroken[0][4], generation.stops[0])], (ends, shown)
    if generation.sampling.logprobs is not None:
        made = [piece.completion_tokens for piece in pieces if piece.finish_reason is not None]
        assert len(_by_choice(pieces)) == sum(made) > 0, shown  # one per token
    for cut in cuts:
        again = await continued(server, generation, pieces[:cut])
        assert _without_logprobs(replies(again, count)) == _without_logprobs(unbroken), (cut, again, shown)
        assert _tokens(again) == _tokens(pieces), cut
        assert _numbers(again) == pytest.approx(_numbers(pieces), abs=logprobs_within), cut


def _without_logprobs(made: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return [(*choice[:2], *choice[3:]) for choice in made]


def _by_choice(pieces: list[Delta]) -> list[TokenLogprob]:
    """The tokens' log-probabilities, choice by choice, each choice's in its order."""
    return [one for piece in sorted(pieces, key=lambda piece: piece.index) for one in piece.logprobs]


def _tokens(pieces: list[Delta]) -> list[tuple[str, list[str]]]:
    """Each token's text, and its likeliest tokens' texts."""
    return [(one.token, [top[0] for top in one.top]) for one in _by_choice(pieces)]


def _numbers(pieces: list[Delta]) -> list[float]:
    """Each token's log-probability, then its likeliest tokens'."""
    return [number for one in _by_choice(pieces) for number in (one.logprob, *(top[1] for top in one.top))]
