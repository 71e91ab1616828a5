"""A reply continued from the pieces its ingress had (``LLMServer.generate`` is
``@continuable``): cut after every piece of a reply and continued on a second server, the
client gets the unbroken reply — its text, tool calls, log-probabilities, finish and
usage — through stop strings held back, characters cut between tokens, ``n`` choices and several
prompts. The echo engine (a token per byte) is deterministic, as a greedy model's replies
are; grammars and tool calls, which need a real tokenizer, are continued on SmolLM2 in
tests/integration/test_llm_continuation.py."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Literal

import pytest

from app_toolkit.exceptions import ContinuationRefused
from app_toolkit.llm import LLMServer
from app_toolkit.llm.engine import Sampling
from app_toolkit.llm.engines.echo import EchoEngine
from app_toolkit.llm.events import Delta, Generation
from app_toolkit.llm.replica.continued import continue_generation
from tests.continued_replies import continued, replies, server_on, whole

SAID = "Crème brûlée — 日本語 and more"  # characters of 2, 3 and 4 bytes: one token per byte


async def _server(tokenizer: Literal["bytes", "words"] = "bytes") -> LLMServer:
    return await server_on(EchoEngine(tokens_per_s=1e6, tokenizer=tokenizer))


GENERATIONS = {
    "plain": Generation(Sampling(max_tokens=64), prompt=SAID),
    "stop string held back": Generation(Sampling(max_tokens=64), prompt=SAID, stops=("ée — 日",)),
    "stop string not met": Generation(Sampling(max_tokens=64), prompt=SAID, stops=("ore!", "語 ant")),
    "max tokens inside a character": Generation(Sampling(max_tokens=20), prompt=SAID),
    "logprobs": Generation(Sampling(max_tokens=64, logprobs=2), prompt=SAID),
    "n choices": Generation(Sampling(max_tokens=64), prompt=SAID, n=2),
    "several prompts": Generation(Sampling(max_tokens=64), prompts=(SAID, "short")),
}


@pytest.mark.parametrize("name", GENERATIONS)
@pytest.mark.parametrize("tokenizer", ["bytes", "words"])
def test_a_reply_cut_after_any_piece_continues_as_the_unbroken_one(
    name: str, tokenizer: Literal["bytes", "words"]
) -> None:
    """A token per byte cuts characters; a token per word holds text back for a stop
    string across pieces (a piece sends "brûl" and holds "ée " for "ée — 日")."""
    generation = GENERATIONS[name]
    count = max(1, len(generation.prompts)) * generation.n

    async def scenario() -> None:
        first, second = await _server(tokenizer), await _server(tokenizer)
        pieces = await whole(first, generation)
        assert pieces[0].prompt_tokens > 0 and len(pieces) > 3
        unbroken = replies(pieces, count)
        for cut in range(1, len(pieces)):
            assert replies(await continued(second, generation, pieces[:cut]), count) == unbroken, cut
        await LLMServer.__del__(first)
        await LLMServer.__del__(second)

    asyncio.run(scenario())


def test_pieces_carry_the_ids_of_the_tokens_they_read() -> None:
    async def scenario() -> None:
        server = await _server()
        pieces = [piece async for piece in server.generate(GENERATIONS["plain"])]
        read = [token for piece in pieces for token in piece.tokens]
        assert bytes(read).decode() == SAID  # a token per byte, cut characters included
        await LLMServer.__del__(server)

    asyncio.run(scenario())


def test_a_continuation_is_made_from_deltas_only() -> None:
    with pytest.raises(TypeError, match="Deltas"):
        continue_generation(GENERATIONS["plain"], [Delta(prompt_tokens=3), "text"])
    with pytest.raises(TypeError, match="Deltas"):
        continue_generation(GENERATIONS["plain"], [Delta(prompt_tokens=3), Delta(index=1)])


def test_an_engine_that_cannot_continue_ends_the_reply_as_its_loss_did() -> None:
    async def scenario() -> None:
        server = await _server()
        engine = server._engine
        assert isinstance(engine, EchoEngine)
        engine.capabilities = dataclasses.replace(engine.capabilities, continuation="")
        generation = GENERATIONS["plain"]
        pieces = [piece async for piece in server.generate(generation)]
        with pytest.raises(ContinuationRefused, match="echo engine cannot continue a reply"):
            async for _ in server.generate(continue_generation(generation, pieces[:3])):
                pass
        # Lost before any token reached the ingress: it starts afresh, which any engine can.
        again = [piece async for piece in server.generate(continue_generation(generation, pieces[:1]))]
        assert "".join(piece.text for piece in again) == SAID
        await LLMServer.__del__(server)

    asyncio.run(scenario())
