"""A reply's writer that hangs past the writer timeout and wakes up after another replica
took the reply over writes nothing more: the reader gets the reply once, whole.

Two ``Replies`` objects share one event log, as two replicas share Redis; a model that
stalls on cue stands for the first replica hanging (its keep-alive is silenced with it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from app_toolkit.llm import Delta

from chat.replies import Replies
from chat.schemas import Generation
from chat.settings import Settings

WORDS = [f"w{i}" for i in range(12)]


class _Stream:
    """The model's reply: the prompt count, then one word a piece (skipping the words of a
    prefix it continues), then why it ended; it stalls after ``stall_after`` words until
    ``resume`` is set."""

    def __init__(
        self, generation: Generation, stall_after: int | None, resume: asyncio.Event, pause_s: float
    ) -> None:
        self._skip = len(generation.prefix.split())
        self._stall_after, self._resume, self._pause_s = stall_after, resume, pause_s
        self._pieces = self._deltas()

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> Delta:
        return await anext(self._pieces)

    async def _deltas(self) -> AsyncIterator[Delta]:
        yield Delta(prompt_tokens=len(WORDS))
        for index, word in enumerate(WORDS[self._skip :], start=self._skip):
            if index == self._stall_after:
                await self._resume.wait()
            await asyncio.sleep(self._pause_s)
            yield Delta(text=("" if index == 0 else " ") + word)
        yield Delta(completion_tokens=len(WORDS) - self._skip, finish_reason="stop")

    def cancel(self) -> None:
        pass


class _Model:
    """Stands for the model deployment's handle."""

    def __init__(self, stall_after: int | None, resume: asyncio.Event, pause_s: float) -> None:
        self._stall_after, self._resume, self._pause_s = stall_after, resume, pause_s

    def options(self, **_: Any) -> _Model:
        return self

    def remote(self, generation: Generation) -> _Stream:
        return _Stream(generation, self._stall_after, self._resume, self._pause_s)


class _Replies(Replies.func_or_class):  # type: ignore[misc,name-defined]
    """A Replies replica out of a deployment: nothing awaits its async ``__del__`` here."""

    def __del__(self) -> None:
        pass


def test_a_writer_that_hung_and_woke_up_after_a_take_over_writes_nothing() -> None:
    async def main() -> None:
        settings = Settings(backend="echo", reply_writer_timeout_s=0.3)
        resume = asyncio.Event()
        hung = _Replies(_Model(stall_after=4, resume=resume, pause_s=0.001), settings)
        taker = _Replies(_Model(stall_after=None, resume=resume, pause_s=0.05), settings)
        taker._log = hung._log  # one store, as Redis is for two replicas

        async def silent(*_: Any) -> None:
            await asyncio.Event().wait()  # the hung replica's keep-alive hangs with it

        hung._keep_alive = silent  # type: ignore[method-assign]
        generation = Generation(messages=(("user", " ".join(WORDS)),), max_tokens=len(WORDS))
        await hung.start("r1", generation)
        events = []
        async with asyncio.timeout(10):
            async for event in taker.events("r1"):  # abandoned after 0.3 s: the taker goes on
                events.append(event)
                if len(events) == 5:  # the taker's first word: the hung writer wakes up now
                    resume.set()
        stored = [e for e in await hung._log.read("r1") if e.event != "started"]
        assert [e.event for e in stored][-1] == "done"
        text = "".join(json.loads(e.data)["text"] for e in stored if e.event == "token")
        assert text.split() == WORDS  # once, whole: nothing of the woken writer's
        assert [e.id for e in events] == [e.id for e in stored]
        assert "r1" not in hung._pumps  # it stopped

    asyncio.run(main())
