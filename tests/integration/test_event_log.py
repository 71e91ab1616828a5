"""Event logs (tk.MemoryEventLog, tk.RedisEventLog against a real redis-server): resuming
without repeats, waiting readers, bounds, a writer that went silent, and a Redis stream
that outlives the process that wrote it."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import app_toolkit as tk
from tests.waiting import wait_for_async

MakeLog = Callable[..., tk.EventLog]


@pytest.fixture(params=["memory", "redis"])
def make_log(request: pytest.FixtureRequest) -> MakeLog:
    if request.param == "memory":
        return lambda **options: tk.MemoryEventLog(**options)
    url = request.getfixturevalue("redis_url")
    prefix = f"test:{request.node.name}:{time.monotonic_ns()}:"  # each test its own keys
    return lambda **options: tk.RedisEventLog(url, prefix=prefix, **options)


def run(log: tk.EventLog, body: Callable[[tk.EventLog], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        try:
            return await body(log)
        finally:
            await log.aclose()

    return asyncio.run(main())


async def take(events: Any, count: int | None = None) -> list[tk.LoggedEvent]:
    taken: list[tk.LoggedEvent] = []
    async for event in events:
        taken.append(event)
        if count is not None and len(taken) == count:
            break
    return taken


def test_a_reader_resumes_after_the_last_event_it_saw_without_repeats(make_log: MakeLog) -> None:
    async def body(log: tk.EventLog) -> None:
        ids = [await log.append("r1", f"piece {n}", event="token") for n in range(5)]
        assert len(set(ids)) == 5
        first = await take(await log.follow("r1"), 2)
        assert [e.data for e in first] == ["piece 0", "piece 1"]
        assert [e.id for e in first] == ids[:2] and {e.event for e in first} == {"token"}

        resumed = await log.follow("r1", after=first[-1].id)  # the connection dropped after 2
        await log.append("r1", "piece 5")
        await log.close("r1")
        rest = await take(resumed)
        assert [e.data for e in rest] == ["piece 2", "piece 3", "piece 4", "piece 5"]
        assert rest[-1].event == ""  # a plain message
        assert await take(await log.follow("r1", after=rest[-1].id)) == []  # nothing after the last
        assert [e.data for e in await take(await log.follow("r1"))][0] == "piece 0"  # from the start

    run(make_log(), body)


def test_several_events_appended_at_once_are_read_in_order_with_their_own_ids(make_log: MakeLog) -> None:
    async def body(log: tk.EventLog) -> None:
        first = await log.append("m1", "start", event="started")
        ids = await log.append_many("m1", [(f"piece {n}", "token") for n in range(4)])
        assert ids == [e.id for e in await log.read("m1")][1:] and len(set(ids)) == 4
        assert await log.append_many("m1", []) == []
        await log.close("m1")
        rest = await take(await log.follow("m1", after=first))
        assert [(e.event, e.data) for e in rest] == [("token", f"piece {n}") for n in range(4)]
        with pytest.raises(ValueError, match="closed"):
            await log.append_many("m1", [("late", "token")])

    run(make_log(), body)


def test_waiting_readers_get_each_event_as_it_comes_and_end_when_it_closes(make_log: MakeLog) -> None:
    async def body(log: tk.EventLog) -> None:
        await log.append("r2", "0")
        readers = [asyncio.create_task(take(await log.follow("r2"))) for _ in range(3)]
        for n in range(1, 4):
            await asyncio.sleep(0.05)
            await log.append("r2", str(n))
        await asyncio.sleep(0.05)
        assert not any(reader.done() for reader in readers)  # waiting for more, not ended
        await log.close("r2")
        async with asyncio.timeout(5):
            results = await asyncio.gather(*readers)
        assert [[e.data for e in got] for got in results] == [["0", "1", "2", "3"]] * 3

    run(make_log(), body)


def test_unknown_streams_and_bad_ids_are_refused_before_following(make_log: MakeLog) -> None:
    async def body(log: tk.EventLog) -> None:
        with pytest.raises(tk.UnknownStream):
            await log.follow("never-written")
        last = await log.append("r3", "x")
        for bad in ("garbage", "1-2-3", "-1", "99999999999999999999999"):
            with pytest.raises(ValueError, match="event id"):
                await log.follow("r3", after=bad)
        later = "9" if isinstance(log, tk.MemoryEventLog) else "99999999999999-0"
        with pytest.raises(ValueError, match="no event"):
            await log.follow("r3", after=later)  # an id the stream has not given
        assert [e.data for e in await take(await log.follow("r3", after=""), 1)] == ["x"]
        for name in ("", "a{b}", "x" * 201, "new\nline"):
            with pytest.raises(ValueError, match="stream name"):
                await log.append(name, "x")
        await log.close("r3")
        with pytest.raises(ValueError, match="closed"):
            await log.append("r3", "too late")
        with pytest.raises(tk.UnknownStream):
            await log.close("never-written")
        with pytest.raises(tk.UnknownStream):
            await log.touch("never-written")
        assert last

    run(make_log(), body)


def test_a_silent_writer_is_reported_to_readers_instead_of_waited_for(make_log: MakeLog) -> None:
    async def body(log: tk.EventLog) -> None:
        await log.append("r4", "first")
        events = await log.follow("r4")
        started = time.monotonic()
        with pytest.raises(tk.StreamAbandoned):
            await take(events)
        assert 0.4 <= time.monotonic() - started < 5  # after writer_timeout_s, not forever

        await log.append("r5", "first")
        reader = asyncio.create_task(take(await log.follow("r5")))
        for _ in range(8):  # 1.6 s of a writer that is slow but alive
            await asyncio.sleep(0.2)
            await log.touch("r5")
        assert not reader.done()
        await log.append("r5", "second")
        await log.close("r5")
        async with asyncio.timeout(5):
            assert [e.data for e in await reader] == ["first", "second"]

    run(make_log(writer_timeout_s=0.5), body)


def test_a_reader_with_every_event_of_an_abandoned_stream_is_refused_before_following(
    make_log: MakeLog,
) -> None:
    async def body(log: tk.EventLog) -> None:
        first = await log.append("a1", "piece 0")
        second = await log.append("a1", "piece 1")
        assert [e.data for e in await take(await log.follow("a1"), 2)] == ["piece 0", "piece 1"]
        await log.release("a1")  # its writer's process stops
        # A reader behind gets the rest first, then hears of it while following ...
        behind = await log.follow("a1", after=first)
        assert (await anext(behind)).data == "piece 1"
        with pytest.raises(tk.StreamAbandoned):
            await anext(behind)
        # ... and one that has it all hears of it at once (a route can answer 410).
        with pytest.raises(tk.StreamAbandoned):
            await log.follow("a1", after=second)
        assert await log.take_over("a1")  # a new writer: followed again
        waiting = await log.follow("a1", after=second)
        await log.append("a1", "piece 2")
        assert (await anext(waiting)).data == "piece 2"
        await log.close("a1")
        await log.release("a1")  # closed: nothing to let go of, and followed to its end
        assert [e.data for e in await take(await log.follow("a1", after=second))] == ["piece 2"]

    run(make_log(writer_timeout_s=30), body)


def test_one_taker_becomes_the_writer_of_an_abandoned_stream_and_readers_follow_it(
    make_log: MakeLog,
) -> None:
    async def body(log: tk.EventLog) -> None:
        await log.append("t1", "started", event="started")
        first = await log.append("t1", "piece 0")
        assert not await log.take_over("t1")  # its writer is alive
        with pytest.raises(tk.StreamAbandoned):
            await take(await log.follow("t1", after=first))
        takers = await asyncio.gather(*(log.take_over("t1") for _ in range(5)))
        assert sorted(takers) == [False] * 4 + [True]  # exactly one becomes the writer
        assert [(e.event, e.data) for e in await log.read("t1")] == [("started", "started"), ("", "piece 0")]

        reader = asyncio.create_task(take(await log.follow("t1", after=first)))
        await asyncio.sleep(0.3)  # the new writer's lease keeps the reader waiting
        assert not reader.done()
        await log.append("t1", "piece 1")
        await log.close("t1")
        async with asyncio.timeout(5):
            assert [e.data for e in await reader] == ["piece 1"]
        assert not await log.take_over("t1")  # closed: nobody takes it over
        with pytest.raises(tk.UnknownStream):
            await log.take_over("never written")
        with pytest.raises(tk.UnknownStream):
            await log.read("never written")

    run(make_log(writer_timeout_s=0.5), body)


def test_a_writer_that_lets_go_is_taken_over_at_once_not_after_its_timeout(make_log: MakeLog) -> None:
    async def body(log: tk.EventLog) -> None:
        first = await log.append("g1", "piece 0")
        reader = asyncio.create_task(take(await log.follow("g1", after=first)))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await log.release("g1")  # the writer's process is stopping
        with pytest.raises(tk.StreamAbandoned):
            async with asyncio.timeout(5):
                await reader
        assert time.monotonic() - started < 3  # not writer_timeout_s (30 s)
        assert await log.take_over("g1")
        await log.append("g1", "piece 1")
        await log.close("g1")
        await log.release("g1")  # closed: nothing to let go of
        assert [e.data for e in await take(await log.follow("g1"))] == ["piece 0", "piece 1"]
        with pytest.raises(tk.UnknownStream):
            await log.release("never written")

    run(make_log(writer_timeout_s=30), body)


def test_a_stream_keeps_its_newest_events_and_is_dropped_after_keep_s(make_log: MakeLog) -> None:
    async def body(log: tk.EventLog) -> None:
        for n in range(6):
            await log.append("r6", str(n))
        await log.close("r6")
        assert [e.data for e in await take(await log.follow("r6"))] == ["3", "4", "5"]
        await asyncio.sleep(0.8)
        with pytest.raises(tk.UnknownStream):
            await log.follow("r6")

    run(make_log(max_events=3, keep_s=0.4), body)


def test_a_writer_whose_stream_was_dropped_is_told_so_and_does_not_make_it_again(make_log: MakeLog) -> None:
    async def body(log: tk.EventLog) -> None:
        await log.append("dropped", "0")
        await log.append("filler", "0")
        await asyncio.sleep(0.5)  # both silent past writer_timeout_s + keep_s: dropped
        await log.append("other", "x")  # (the memory log drops them to make room for it)
        for _ in range(2):  # and at every later append, not only the first
            with pytest.raises(tk.UnknownStream, match="gone since this log wrote it"):
                await log.append("dropped", "1")
        with pytest.raises(tk.UnknownStream):
            await log.follow("dropped")
        await log.append("other", "y")  # a stream that is there takes appends as ever
        assert [e.data for e in await log.read("other")] == ["x", "y"]

    log = make_log(writer_timeout_s=0.1, keep_s=0.2)
    if isinstance(log, tk.MemoryEventLog):
        log = tk.MemoryEventLog(max_streams=2, writer_timeout_s=0.1, keep_s=0.2)
    run(log, body)


def test_the_memory_log_holds_at_most_max_streams() -> None:
    async def body(log: tk.EventLog) -> None:
        await log.append("a", "x")
        await log.append("b", "x")
        with pytest.raises(OverflowError, match="max_streams"):
            await log.append("c", "x")  # both are being written
        await log.close("a")
        await asyncio.sleep(0.3)  # past keep_s: its place is free
        await log.append("c", "x")
        assert len(log) == 2  # type: ignore[arg-type]

    run(tk.MemoryEventLog(max_streams=2, keep_s=0.2), body)

    async def busy(log: tk.EventLog) -> None:
        for name in ("a", "b", "c"):
            await log.append(name, "x")
        await log.close("b")
        await log.close("a")
        await log.append("d", "x")  # full: "b", closed longest ago, makes room, within its keep_s
        with pytest.raises(tk.UnknownStream):
            await log.follow("b")
        assert [e.data for e in await take(await log.follow("a"))] == ["x"]
        await log.append("e", "x")  # then "a"
        with pytest.raises(OverflowError, match="max_streams"):
            await log.append("f", "x")  # c, d and e are all being written
        assert len(log) == 3  # type: ignore[arg-type]

    run(tk.MemoryEventLog(max_streams=3, keep_s=300), busy)


def test_logs_refuse_bad_settings() -> None:
    for options in ({"max_events": 0}, {"keep_s": 0}, {"writer_timeout_s": -1}):
        with pytest.raises(ValueError):
            tk.MemoryEventLog(**options)
    with pytest.raises(ValueError, match="redis://"):
        tk.RedisEventLog("http://127.0.0.1:6379")


_WRITER = """
import asyncio, os, pickle, sys, time
log = pickle.loads(bytes.fromhex(sys.argv[1]))
async def main():
    for n in range(3):
        await log.append("outlives", f"piece {n}")
    print("written", flush=True)
    await asyncio.sleep(600)  # killed here, its stream open
asyncio.run(main())
"""


def test_a_redis_stream_outlives_the_process_that_wrote_it(redis_url: str) -> None:
    log = tk.RedisEventLog(redis_url, prefix=f"test:outlives:{time.monotonic_ns()}:", writer_timeout_s=1.0)
    command = [sys.executable, "-c", _WRITER, pickle.dumps(log).hex()]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as writer:
        try:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "written"
        finally:
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait(10)

    async def body(log: tk.EventLog) -> None:
        got: list[str] = []
        with pytest.raises(tk.StreamAbandoned):
            async for event in await log.follow("outlives"):
                got.append(event.data)
        assert got == ["piece 0", "piece 1", "piece 2"]

    run(log, body)


def test_a_replaced_writer_that_wakes_up_cannot_write_next_to_its_successor(make_log: MakeLog) -> None:
    async def body(log: tk.EventLog) -> None:
        await log.append("f1", "piece 0", writer="first")
        await log.append_many("f1", [("piece 1", "")], writer="first")
        await log.touch("f1", writer="first")
        await asyncio.sleep(0.6)  # the first writer hangs past writer_timeout_s
        assert await log.take_over("f1", writer="second")
        await log.append("f1", "piece 2", writer="second")
        # The first writer wakes up: everything it does as the writer is refused.
        for call in (
            log.append("f1", "late", writer="first"),
            log.append_many("f1", [("late", "")], writer="first"),
            log.touch("f1", writer="first"),
            log.close("f1", writer="first"),
        ):
            with pytest.raises(tk.WriterReplaced):
                await call
        await log.release("f1", writer="first")  # not its stream any more: nothing happens
        reader = asyncio.create_task(take(await log.follow("f1")))
        await asyncio.sleep(0.3)
        assert not reader.done()  # the successor still holds it
        await log.append("f1", "stopped elsewhere", "done")  # naming no writer (a stop): allowed
        await log.close("f1", writer="second")
        async with asyncio.timeout(5):
            assert [e.data for e in await reader] == ["piece 0", "piece 1", "piece 2", "stopped elsewhere"]
        # A take-over naming no writer still fences out the one it replaced.
        await log.append("f2", "piece 0", writer="first")
        await asyncio.sleep(0.6)
        assert await log.take_over("f2")
        with pytest.raises(tk.WriterReplaced):
            await log.append("f2", "late", writer="first")
        await log.append("f2", "piece 1")
        assert [e.data for e in await log.read("f2")] == ["piece 0", "piece 1"]

    run(make_log(writer_timeout_s=0.5), body)


def test_a_redis_log_two_replicas_share_stays_open_until_the_last_of_them_stops(redis_url: str) -> None:
    """The local backend's replicas share one log object: the first replica to stop must
    not close the connections another replica's stream is reading from; the last one
    closes them, unless the log is used outside replicas too (then ``aclose`` does)."""
    import redis.asyncio as aioredis

    from app_toolkit._runtime import request_context

    log = tk.RedisEventLog(redis_url, prefix=f"test:shared:{time.monotonic_ns()}:")
    first: list[request_context.StopHook] = []
    second: list[request_context.StopHook] = []

    async def as_replica(hooks: list[request_context.StopHook], call: Awaitable[Any]) -> Any:
        token = request_context.stop_hooks.set(hooks)
        try:
            return await call
        finally:
            request_context.stop_hooks.reset(token)

    async def stop(hooks: list[request_context.StopHook]) -> None:
        for hook in hooks:
            await hook()
        hooks.clear()

    async def main() -> None:
        server = aioredis.Redis.from_url(redis_url)

        async def clients(field: str) -> int:
            return int((await server.info("clients"))[field])

        async def reader(hooks: list[request_context.StopHook] | None, stream: str) -> asyncio.Task[Any]:
            """A reader of ``stream`` in a replica (``hooks``) or outside any, once it
            waits in XREAD on one of the log's connections."""
            blocked = await clients("blocked_clients")
            token = request_context.stop_hooks.set(hooks)
            try:
                task = asyncio.create_task(take(await log.follow(stream)))
            finally:
                request_context.stop_hooks.reset(token)

            async def waiting() -> bool:
                return await clients("blocked_clients") > blocked

            await wait_for_async(waiting, 5, "the reader to wait in XREAD")
            return task

        try:
            await as_replica(first, log.append("a", "piece 0"))
            await as_replica(second, log.append("b", "piece 0"))
            await as_replica(second, log.append("b", "piece 1"))
            assert (len(first), len(second)) == (1, 1)  # one stop hook per replica
            following = await reader(second, "b")
            before = await clients("connected_clients")
            await stop(first)  # the first replica goes; the second one's reader goes on
            await as_replica(second, log.append("b", "piece 2"))
            await as_replica(second, log.close("b"))
            async with asyncio.timeout(5):
                assert [e.data for e in await following] == ["piece 0", "piece 1", "piece 2"]
            await stop(second)  # the last replica: the client's connections close

            async def closed() -> bool:
                return await clients("connected_clients") < before

            await wait_for_async(closed, 5, "the log's connections to close")
            # Used outside replicas too, the log stays open when its last replica stops.
            await as_replica(first, log.append("c", "piece 0"))
            outside = await reader(None, "c")
            await stop(first)
            await log.append("c", "piece 1")
            await log.close("c")
            async with asyncio.timeout(5):
                assert [e.data for e in await outside] == ["piece 0", "piece 1"]
        finally:
            await server.aclose()
            await log.aclose()

    asyncio.run(main())
