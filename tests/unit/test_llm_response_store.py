"""The ingress's kept responses, with a fake clock: bounded in number and age, ended ones
make room first, in-progress ones never go, and a stream's events are followed from a
``sequence_number``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from app_toolkit.event_log import StreamAbandoned
from app_toolkit.llm.errors import OpenAIError
from app_toolkit.llm.events import Delta
from app_toolkit.llm.openai import response_store
from app_toolkit.llm.openai.response_store import ResponseStore
from app_toolkit.llm.openai.responses import Event, Reply, ResponsesRequest


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _reply(text: str = "hi", *, ended: bool = True) -> Reply:
    reply = Reply(ResponsesRequest(input=text), "m", 2, ({"role": "user", "content": text},))
    if ended:
        reply.text = [text]
        reply.end(Delta(completion_tokens=len(text), finish_reason="stop"))
    return reply


def test_responses_go_after_keep_s() -> None:
    clock = Clock()
    store = ResponseStore(max_kept=10, keep_s=60, max_producing=1, clock=clock)
    old = _reply()
    store.keep(old)
    clock.now = 59
    assert store.get(old.id) is old
    clock.now = 61
    with pytest.raises(OpenAIError) as gone:
        store.get(old.id)
    assert gone.value.status == 404


def test_the_oldest_ended_response_makes_room_and_in_progress_ones_stay() -> None:
    store = ResponseStore(max_kept=3, keep_s=60, max_producing=1, clock=Clock())
    running, ended, newer = _reply(ended=False), _reply(), _reply()
    for reply in (running, ended, newer):
        store.keep(reply)
    store.keep(_reply())
    assert len(store) == 3 and store.get(running.id) is running and store.get(newer.id) is newer
    with pytest.raises(OpenAIError):
        store.get(ended.id)
    full = ResponseStore(max_kept=2, keep_s=60, max_producing=1, clock=Clock())
    full.keep(_reply(ended=False))
    full.keep(_reply(ended=False))
    with pytest.raises(OpenAIError) as overloaded:
        full.keep(_reply())
    assert overloaded.value.status == 503


def test_previous_response_id_continues_an_ended_response_only() -> None:
    store = ResponseStore(max_kept=3, keep_s=60, max_producing=1, clock=Clock())
    done, running = _reply("first"), _reply(ended=False)
    store.keep(done)
    store.keep(running)
    assert store.conversation(done.id) == (
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "first"},
    )
    with pytest.raises(OpenAIError) as busy:
        store.conversation(running.id)
    assert (busy.value.status, busy.value.param) == (400, "previous_response_id")
    with pytest.raises(OpenAIError) as missing:
        store.conversation("resp_nothing")
    assert (missing.value.status, missing.value.param) == (404, "previous_response_id")
    assert store.referenced(done.message_id, "input[0].id") == {"role": "assistant", "content": "first"}
    for unknown in (running.message_id, "msg_nothing"):
        with pytest.raises(OpenAIError) as not_referable:
            store.referenced(unknown, "input[1].id")
        assert (not_referable.value.status, not_referable.value.param) == (404, "input[1].id")


def test_a_produced_stream_is_followed_from_a_sequence_number() -> None:
    async def body() -> None:
        store = ResponseStore(max_kept=3, keep_s=60, max_producing=1)
        reply = _reply(ended=False)
        go_on = asyncio.Event()

        async def events() -> AsyncIterator[Event]:
            for number in range(3):
                yield reply.event("response.created" if number == 0 else "response.output_text.delta")
            await go_on.wait()
            reply.end(Delta(finish_reason="stop"))
            yield reply.event("response.completed")

        followed = await store.produce(reply, events())
        with pytest.raises(OpenAIError) as busy:  # max_producing: one at a time
            await store.produce(_reply(ended=False), events())
        assert busy.value.status == 503
        with pytest.raises(OpenAIError) as ahead:
            await store.follow(reply.id, 7)
        assert ahead.value.param == "starting_after"
        go_on.set()
        seen = [json.loads(e.data)["sequence_number"] async for e in followed.events]
        later = await store.follow(reply.id, 1)
        assert seen == [0, 1, 2, 3] and [e.kind async for e in later.events][-1] == "response.completed"
        assert later.next_number() == 4
        await store.close()

    asyncio.run(body())


def test_close_stops_the_responses_still_produced_with_the_retry_error() -> None:
    """One producing (its model never ends) and one whose task has not started yet."""

    async def body() -> None:
        store = ResponseStore(max_kept=3, keep_s=60, max_producing=2)
        waiting = asyncio.Event()

        async def events(reply: Reply) -> AsyncIterator[Event]:
            yield reply.event("response.created")
            waiting.set()
            await asyncio.Event().wait()  # a model that never ends
            yield reply.event("response.completed")

        running, fresh = _reply(ended=False), _reply(ended=False)
        first = await store.produce(running, events(running))
        await waiting.wait()
        second = await store.produce(fresh, events(fresh))
        await store.close()
        for followed, reply in ((first, running), (second, fresh)):
            async with asyncio.timeout(5):  # not the 600 s a silent producer is given
                kinds = [e.kind async for e in followed.events]
            assert kinds == ["response.created", "error"] and reply.status == "failed"

    asyncio.run(body())


def test_a_silent_producer_ends_its_readers_streams_with_an_error_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader still behind gets the rest first; one that has it all gets the error at once."""
    monkeypatch.setattr(response_store, "PRODUCER_SILENCE_S", 0.2)

    async def body() -> None:
        store = ResponseStore(max_kept=3, keep_s=60, max_producing=1)
        reply = _reply(ended=False)

        async def events() -> AsyncIterator[Event]:
            yield reply.event("response.created")
            yield reply.event("response.output_text.delta")
            await asyncio.Event().wait()  # a model that hangs
            yield reply.event("response.completed")

        followed = await store.produce(reply, events())
        async with asyncio.timeout(5):
            behind = [(e.kind, json.loads(e.data)["sequence_number"]) async for e in followed.events]
            assert behind == [("response.created", 0), ("response.output_text.delta", 1), ("error", 2)]
            with pytest.raises(StreamAbandoned):  # refused before following: no wait for it
                await store._log.follow(reply.id, "2")
            caught_up = await store.follow(reply.id, 1)
            assert [(e.kind, json.loads(e.data)["sequence_number"]) async for e in caught_up.events] == [
                ("error", 2)
            ]
        await store.close()

    asyncio.run(body())
