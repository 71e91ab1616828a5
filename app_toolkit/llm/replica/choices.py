"""A request's ``n`` choices: ``n`` replies to one prompt, each sampled on its own (a seeded
request's choice ``i`` takes the seed plus ``i``, as vLLM's children do), their pieces sent
as they come, each marked with its choice's index."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from app_toolkit.llm.engine import Sampling
from app_toolkit.llm.events import Delta

#: A seed is a signed 64-bit integer: a choice's seed past it wraps around.
_SEEDS = 2**64
_LOWEST_SEED = -(2**63)


def seeded(sampling: Sampling, index: int) -> Sampling:
    """Choice ``index``'s sampling: the seed plus ``index`` (a seedless one stays so)."""
    if sampling.seed is None or index == 0:
        return sampling
    seed = (sampling.seed + index - _LOWEST_SEED) % _SEEDS + _LOWEST_SEED
    return dataclasses.replace(sampling, seed=seed)


async def merged(replies: Sequence[AsyncIterator[Delta]]) -> AsyncGenerator[Delta, None]:
    """The pieces of every reply as each comes, marked with the reply's index; the first
    reply to fail ends them all with its error. Closing it closes every reply at once."""
    # A bounded queue: a slow reader holds every reply back.
    queue: asyncio.Queue[tuple[int, Delta | Exception | None]] = asyncio.Queue(maxsize=len(replies))

    async def pump(index: int, reply: AsyncIterator[Delta]) -> None:
        try:
            try:
                async for delta in reply:
                    await queue.put((index, delta))
            finally:
                if isinstance(reply, AsyncGenerator):
                    await reply.aclose()
            await queue.put((index, None))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, who raises it
            await queue.put((index, exc))
        except asyncio.CancelledError as cancelled:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the reader left: merged() cancels its pumps
            await queue.put((index, RuntimeError(f"reply {index} was cancelled: {cancelled}")))

    tasks = [asyncio.create_task(pump(index, reply)) for index, reply in enumerate(replies)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield dataclasses.replace(item, index=index)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
