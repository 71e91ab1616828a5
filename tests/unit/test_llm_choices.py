"""A request's ``n`` choices: seeds as vLLM's children take them, and replies merged as
their pieces come."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from app_toolkit.llm.engine import Sampling
from app_toolkit.llm.events import Delta
from app_toolkit.llm.replica.choices import merged, seeded


def test_a_choice_takes_the_seed_plus_its_index_wrapping_past_int64() -> None:
    sampling = Sampling(max_tokens=4, seed=10)
    assert [seeded(sampling, index).seed for index in range(3)] == [10, 11, 12]
    assert seeded(Sampling(max_tokens=4), 2).seed is None
    assert seeded(Sampling(max_tokens=4, seed=2**63 - 1), 1).seed == -(2**63)


async def _reply(text: str, gap_s: float, fail: bool = False) -> AsyncGenerator[Delta, None]:
    for piece in text:
        await asyncio.sleep(gap_s)
        yield Delta(text=piece)
    if fail:
        raise RuntimeError("the engine failed")
    yield Delta(finish_reason="stop", completion_tokens=len(text))


def test_pieces_come_as_each_reply_makes_them_marked_with_its_index() -> None:
    async def scenario() -> list[Delta]:
        return [delta async for delta in merged([_reply("aaa", 0.03), _reply("bb", 0.01)])]

    deltas = asyncio.run(scenario())
    assert "".join(d.text for d in deltas if d.index == 0) == "aaa"
    assert "".join(d.text for d in deltas if d.index == 1) == "bb"
    assert [d.index for d in deltas if d.finish_reason] == [1, 0]  # the quicker one ends first
    assert deltas[0].index == 1


def test_one_failing_reply_ends_them_all_and_closing_stops_every_reply() -> None:
    closed: list[int] = []

    async def watched(index: int) -> AsyncGenerator[Delta, None]:
        try:
            while True:
                await asyncio.sleep(0.01)
                yield Delta(text="x")
        finally:
            closed.append(index)

    async def failing() -> None:
        async for _ in merged([watched(0), _reply("b", 0.02, fail=True)]):
            pass

    with pytest.raises(RuntimeError, match="the engine failed"):
        asyncio.run(failing())
    assert closed == [0]

    async def leaving() -> None:
        stream = merged([watched(1), watched(2)])
        await anext(stream)
        await stream.aclose()

    asyncio.run(leaving())
    assert sorted(closed[1:]) == [1, 2]
