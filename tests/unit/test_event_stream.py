"""EventStream's event source at a drain: a stream runs on to the drain's deadline and
ends with its final event there; a resumable one (an event log's events, or one marked
``end_at_drain``) ends when the drain starts; a hurried drain ends every stream at once.
The user's generator is always closed properly — at a drain and when the stream is
cancelled (client gone). And the OpenAI error events each client raises."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator

import pytest
from packaging.version import Version
from sse_starlette import ServerSentEvent

from app_toolkit._runtime import request_context
from app_toolkit._runtime.drain_signal import DrainSignal
from app_toolkit.event_log import LoggedEvent, MemoryEventLog
from app_toolkit.exceptions import ReplicaUnavailableError
from app_toolkit.streaming import (
    DRAIN_EVENT,
    ChatCompletionStream,
    EventStream,
    FinalEvent,
    OpenAIErrorEvent,
    _chat_chunks,
    _events,
)

pytestmark = pytest.mark.anyio


class Source:
    """A generator that yields one event, then waits forever; records how it ended."""

    def __init__(self, first: object = "first") -> None:
        self.first = first
        self.waiting = asyncio.Event()
        self.ended: list[str] = []

    async def events(self) -> AsyncIterator[object]:
        try:
            yield self.first
            self.waiting.set()
            await asyncio.Event().wait()
            yield "never"
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise
        finally:
            self.ended.append("closed")


@pytest.fixture
def signal() -> Iterator[DrainSignal]:
    """The drain signal of the replica "serving" the test's streams."""
    drain = DrainSignal()
    token = request_context.drain_signal.set(drain)
    try:
        yield drain
    finally:
        request_context.drain_signal.reset(token)


async def waiting_for_more(
    source: Source, final_event: FinalEvent = DRAIN_EVENT, end_at_drain: bool | None = None
) -> tuple[AsyncIterator[ServerSentEvent], asyncio.Future[ServerSentEvent]]:
    """A stream of ``source`` that sent its first event and waits for the next."""
    stream = _events(source.events(), True, final_event, end_at_drain)
    await anext(stream)
    pending = asyncio.ensure_future(anext(stream))
    await source.waiting.wait()
    return stream, pending


async def ended(stream: AsyncIterator[ServerSentEvent]) -> None:
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_a_stream_runs_on_through_the_drain_and_ends_at_its_deadline(signal: DrainSignal) -> None:
    source = Source()
    stream, pending = await waiting_for_more(source)
    signal.begin()
    await asyncio.sleep(0.05)  # the drain has started: the stream still waits for its source
    assert not pending.done() and source.ended == []
    signal.end_streams()
    assert await asyncio.wait_for(pending, 5) is DRAIN_EVENT
    await ended(stream)
    assert source.ended == ["cancelled", "closed"]
    assert signal.watching == 0  # its watch is closed


@pytest.mark.parametrize(
    ("first", "end_at_drain"),
    [
        (LoggedEvent("5-0", "", "logged"), None),  # an event log's: its client resumes after 5-0
        ("a feed", True),  # an endless feed whose author says it may end
    ],
    ids=["event-log", "marked"],
)
async def test_a_resumable_stream_ends_when_the_drain_starts(
    signal: DrainSignal, first: object, end_at_drain: bool | None
) -> None:
    source = Source(first)
    stream, pending = await waiting_for_more(source, end_at_drain=end_at_drain)
    signal.begin()
    assert await asyncio.wait_for(pending, 5) is DRAIN_EVENT
    await ended(stream)
    assert source.ended == ["cancelled", "closed"]


async def test_an_event_log_follower_with_nothing_sent_yet_ends_when_the_drain_starts(
    signal: DrainSignal,
) -> None:
    log = MemoryEventLog()
    await log.append("reply", "earlier")
    following = await log.follow("reply", after=(await log.read("reply"))[-1].id)  # at its end: quiet
    stream = _events(following, True, DRAIN_EVENT, None)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)  # it waits for the log's next event
    assert not pending.done()
    signal.begin()  # resumable from the start: it need not have sent an event first
    assert await asyncio.wait_for(pending, 5) is DRAIN_EVENT
    await ended(stream)


async def test_a_stream_that_ended_as_the_deadline_came_gets_no_final_event(signal: DrainSignal) -> None:
    async def last_events() -> AsyncIterator[object]:
        yield "the last event"  # and then it ends

    stream = _events(last_events(), True, DRAIN_EVENT, None)
    assert (await anext(stream)).data == "the last event"
    signal.end_streams()  # the deadline comes just after its last event went out
    await ended(stream)  # it ends as it would have: no drain event after its last one


async def test_an_event_log_stream_marked_otherwise_waits_for_the_deadline(signal: DrainSignal) -> None:
    source = Source(LoggedEvent("5-0", "", "logged"))
    stream, pending = await waiting_for_more(source, end_at_drain=False)
    signal.begin()
    await asyncio.sleep(0.05)
    assert not pending.done()
    signal.end_streams()
    assert await asyncio.wait_for(pending, 5) is DRAIN_EVENT
    await ended(stream)


async def test_a_hurried_drain_ends_every_stream_at_once(signal: DrainSignal) -> None:
    source = Source()
    stream, pending = await waiting_for_more(source, end_at_drain=False)
    signal.begin(hurry=True)
    assert await asyncio.wait_for(pending, 5) is DRAIN_EVENT
    await ended(stream)


async def test_the_final_event_may_be_made_when_the_stream_ends(signal: DrainSignal) -> None:
    made: list[int] = []

    def numbered() -> ServerSentEvent:
        made.append(len(made) + 1)
        return ServerSentEvent(data=f"last {made[-1]}")

    stream, pending = await waiting_for_more(Source(), final_event=numbered)
    assert made == []  # not before the stream ends
    signal.end_streams()
    assert (await asyncio.wait_for(pending, 5)).data == "last 1"
    await ended(stream)


async def test_without_a_final_event_the_stream_just_ends(signal: DrainSignal) -> None:
    stream, pending = await waiting_for_more(Source(), final_event=None)
    signal.end_streams()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 5)


async def test_a_failing_final_event_ends_the_stream_without_one(
    signal: DrainSignal, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> ServerSentEvent:
        raise RuntimeError("no last word")

    signal.end_streams()  # already at the deadline: the stream ends before reading
    stream = _events(Source().events(), True, broken, None)
    with caplog.at_level(logging.ERROR, "app_toolkit.streaming"):
        await ended(stream)
    assert "final_event failed" in caplog.text


async def test_the_drain_counts_the_streams_that_have_not_ended(signal: DrainSignal) -> None:
    stream, pending = await waiting_for_more(Source())
    assert signal.watching == 1
    signal.end_streams()
    await pending
    assert signal.watching == 1  # it has not taken its last event yet
    await ended(stream)
    assert signal.watching == 0


async def test_a_cancelled_stream_stops_the_source_it_was_waiting_on(signal: DrainSignal) -> None:
    tasks_before = asyncio.all_tasks()
    source = Source()
    stream, pending = await waiting_for_more(source)
    assert isinstance(stream, AsyncGenerator)  # an async generator function's: it has aclose()
    pending.cancel()  # the client left
    with pytest.raises(asyncio.CancelledError):
        await pending
    await stream.aclose()
    assert source.ended == ["cancelled", "closed"]
    assert signal.watching == 0
    await asyncio.sleep(0)  # let cancelled helpers finish
    assert asyncio.all_tasks() == tasks_before


def data(event: ServerSentEvent | dict[str, str]) -> object:
    raw = event.data if isinstance(event, ServerSentEvent) else event["data"]
    return json.loads(str(raw)) if raw != "[DONE]" else raw


async def test_a_chat_stream_ends_with_the_restart_error_at_the_deadline(signal: DrainSignal) -> None:
    source = Source("hello ")
    with request_context.request_scope("req-7"):
        stream = ChatCompletionStream(source.events(), model="toy").body_iterator  # type: ignore[arg-type]
        assert isinstance(stream, AsyncGenerator)
        sent = [await anext(stream), await anext(stream)]  # the role chunk, "hello "
        pending = asyncio.ensure_future(anext(stream))
        await source.waiting.wait()
        signal.begin()
        await asyncio.sleep(0.05)
        assert not pending.done()  # a chat stream is not resumable: it runs on
        signal.end_streams()
        last = await asyncio.wait_for(pending, 5)
        await ended(stream)
    assert [data(e)["choices"][0]["delta"] for e in sent] == [  # type: ignore[index]
        {"role": "assistant", "content": ""},
        {"content": "hello "},
    ]
    assert data(last) == {  # no [DONE] after it
        "error": {
            "message": "The server is restarting; retry the request (request id req-7).",
            "type": "server_error",
            "code": "server_restarting",
            "param": None,
        }
    }


async def test_a_chat_stream_whose_source_replica_went_away_ends_with_the_restart_error() -> None:
    async def pieces() -> AsyncIterator[str]:
        yield "one "
        raise ReplicaUnavailableError("Connection to 10.0.0.2:4000 closed")

    chunks = [data(chunk) async for chunk in _chat_chunks(pieces(), "toy", True, 0, "stop", None)]
    assert chunks[-1] == {
        "error": {
            "message": "The server is restarting; retry the request.",
            "type": "server_error",
            "code": "server_restarting",
            "param": None,
        }
    }
    assert "[DONE]" not in chunks and len(chunks) == 3  # role, "one ", the error


async def test_a_chat_stream_has_openais_chunk_fields_and_null_usage_before_the_usage_chunk() -> None:
    # As OpenAI streams with stream_options.include_usage (and app_toolkit.llm's server):
    # each choice has "logprobs": null, every chunk before the usage chunk "usage": null.
    chunks = [data(chunk) async for chunk in _chat_chunks(["Hel", "lo"], "toy", True, 3, "stop", None)]
    assert chunks[-1] == "[DONE]"
    *streamed, usage = chunks[:-1]
    assert [c["choices"][0] for c in streamed] == [  # type: ignore[index]
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
        {"index": 0, "delta": {"content": "Hel"}, "logprobs": None, "finish_reason": None},
        {"index": 0, "delta": {"content": "lo"}, "logprobs": None, "finish_reason": None},
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"},
    ]
    assert all(isinstance(c, dict) and "usage" in c and c["usage"] is None for c in streamed)
    assert usage["choices"] == []  # type: ignore[index]
    assert usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}  # type: ignore[index]
    # Without include_usage no chunk has the field, as OpenAI's.
    plain = [data(chunk) async for chunk in _chat_chunks(["Hi"], "toy", False, 0, "stop", None)]
    assert not any(isinstance(c, dict) and "usage" in c for c in plain)


def test_the_openai_error_events_have_the_shapes_every_client_raises() -> None:
    error = OpenAIErrorEvent("The server is restarting.", "server_restarting")
    chat = error.chat_completions()
    # Chat Completions: a lone "error" object, no chunk fields (the AI SDK would match a
    # chunk with "choices" and drop the error), no event name needed.
    assert chat.event is None
    assert data(chat) == {
        "error": {
            "message": "The server is restarting.",
            "type": "server_error",
            "code": "server_restarting",
            "param": None,
        }
    }
    # Responses: OpenAI's documented error event (sequence_number, flat fields) with the
    # error nested too, which is what makes openai-python raise.
    responses = error.responses(12)
    assert responses.event == "error"
    assert data(responses) == {
        "type": "error",
        "sequence_number": 12,
        "code": "server_restarting",
        "message": "The server is restarting.",
        "param": None,
        "error": {
            "message": "The server is restarting.",
            "type": "server_error",
            "code": "server_restarting",
            "param": None,
        },
    }


async def test_a_send_without_a_timeout_opens_no_cancel_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    """sse-starlette wraps every send in an anyio cancel scope (about 11 µs, a chat
    stream's every token) even with no ``send_timeout``; an EventStream sends directly
    then, and keeps sse-starlette's timeout when one is set."""
    import anyio
    from sse_starlette.sse import EventSourceResponse, SendTimeoutError

    if Version(importlib.metadata.version("sse-starlette")) < Version("3.4.10"):
        pytest.skip("this sse-starlette sends inline (before 3.4.10)")
    assert hasattr(EventSourceResponse, "_send_with_timeout"), (
        "sse-starlette renamed the send an EventStream overrides"
    )
    scopes: list[float | None] = []
    real = anyio.move_on_after

    def counted(delay: float | None, shield: bool = False) -> anyio.CancelScope:
        scopes.append(delay)
        return real(delay, shield=shield)

    monkeypatch.setattr(anyio, "move_on_after", counted)
    sent: list[object] = []

    async def send(message: object) -> None:
        sent.append(message)

    async def stuck(message: object) -> None:
        await asyncio.sleep(10)

    stream = EventStream(["x"])
    await stream._send_with_timeout(send, {"type": "http.response.body", "body": b"x"})
    assert sent == [{"type": "http.response.body", "body": b"x"}] and scopes == []
    stream.send_timeout = 0.01
    with pytest.raises(SendTimeoutError):
        await stream._send_with_timeout(stuck, {"type": "http.response.body", "body": b"y"})
    assert scopes == [0.01]
