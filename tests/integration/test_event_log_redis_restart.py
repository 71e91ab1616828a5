"""tk.RedisEventLog when its Redis restarts: the pooled connections lead to the killed
server, and each command failing on one is sent once more on a fresh connection; a
stream lost with the server is refused to its writer, never made again; an append sent
again with its token is not applied twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

import app_toolkit as tk
from tests.redis_server import redis_server
from tests.waiting import wait_for_async


async def take(events: AsyncIterator[tk.LoggedEvent]) -> list[str]:
    return [event.data async for event in events]


def test_after_redis_restarts_a_lost_stream_is_refused_to_its_writer_and_readers_and_new_ones_work() -> None:
    import redis.asyncio as aioredis

    with redis_server() as server:
        log = tk.RedisEventLog(server.url, prefix="test:restart:")

        async def main() -> None:
            watcher = aioredis.Redis.from_url(server.url)

            async def blocked() -> bool:
                return int((await watcher.info("clients"))["blocked_clients"]) > 0

            try:
                await log.append("s", "lost")
                following = await log.follow("s")
                assert (await anext(following)).data == "lost"
                waiting = asyncio.create_task(anext(following))
                await wait_for_async(blocked, 5, "the reader to wait in XREAD")
                # Restarted without yielding to the loop: the log's idle connection (and
                # the reader's) learn of it only from their next command, as commands
                # racing a restart do.
                server.restart()
                # No persistence: what the killed server held is gone, and the writer is
                # told so rather than starting the stream again from an id its readers
                # never saw; the reader waiting across the restart learns it too.
                for _ in range(2):  # and at every later append, not only the first
                    with pytest.raises(tk.UnknownStream, match="gone since this log wrote it"):
                        await log.append("s", "after")
                with pytest.raises(tk.UnknownStream):
                    await log.close("s")  # nor does a failed close let it be made again
                with pytest.raises(tk.UnknownStream):
                    await log.append("s", "after")
                with pytest.raises(tk.UnknownStream):
                    await log.read("s")
                async with asyncio.timeout(5):
                    with pytest.raises(tk.UnknownStream):
                        await waiting
                    # New streams are written and followed on fresh connections.
                    first = await log.append("t", "new")
                    following = await log.follow("t")
                    assert (await anext(following)).id == first
                    waiting = asyncio.create_task(anext(following))
                    await log.append("t", "next")
                    assert (await waiting).data == "next"
                    await log.close("t")
                    assert await take(following) == []
            finally:
                await watcher.aclose()
                await log.aclose()

        asyncio.run(main())


def test_an_append_sent_again_with_its_token_adds_nothing_and_gets_the_same_ids(redis_url: str) -> None:
    log = tk.RedisEventLog(redis_url, prefix=f"test:token:{time.monotonic_ns()}:")
    events = [("piece 0", ""), ("piece 1", "token")]

    async def main() -> None:
        try:
            first = await log._append("s", events, "w", "t1")
            assert len(first) == 2
            assert await log._append("s", events, "w", "t1") == first  # its answer lost: sent again
            stored = await log.read("s")
            assert [(e.id, e.data) for e in stored] == [(first[0], "piece 0"), (first[1], "piece 1")]
            second = await log._append("s", events[:1], "w", "t2")  # another token: appended
            assert [e.data for e in await log.read("s")] == ["piece 0", "piece 1", "piece 0"]
            # The append was done, so sent again it gets its ids even once the stream is closed
            # (and the log does not take the closed stream for one it writes).
            await log.close("s", writer="w")
            assert await log._append("s", events[:1], "w", "t2") == second
            assert "s" not in log._written
            with pytest.raises(ValueError, match="closed"):
                await log._append("s", events[:1], "w", "t3")
            assert len(await log.read("s")) == 3
        finally:
            await log.aclose()

    asyncio.run(main())
