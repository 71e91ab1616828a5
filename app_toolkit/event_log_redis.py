"""An event log in Redis Streams: every replica and process reads the same streams, and
they outlive any one of them (``pip install 'app_toolkit[redis]'``).

A stream ``s`` is the Redis stream ``{prefix}{s}`` (its entries' ids are the events' ids,
so an SSE client's ``Last-Event-ID`` is one), beside four small keys: ``…:w``, which the
writer's appends keep alive for ``writer_timeout_s``, ``…:end``, set when it closes,
``…:writer``, the name of its writer (once one is named), and ``…:last``, the token and ids
of its latest append (which makes an append safe to send again).
Appending and closing are Lua scripts (one round trip each, atomic). A command that fails
with a connection error (sent on a connection to a Redis that has restarted since) is sent
once more on a fresh connection, which does nothing twice: reads and the lease scripts
repeat harmlessly, and an append's token makes its second sending return the first one's
ids. (A take-over done but unanswered answers False the second time: no one writes the
stream until its lease runs out and another caller takes it over.) An append to a stream
this log wrote before must find it there (ARGV[6]): one lost with a restarted Redis is
refused, never made again from a first id its readers never saw. Readers wait in
``XREAD BLOCK`` for up to a second at a time, each on a connection of its own from a
pool of ``max_connections`` (a reader that finds none free within ``pool_timeout_s``
gets ``redis.exceptions.ConnectionError``). In replicas, the connections are closed
when the last replica that used them stops (replicas of the local backend share one log);
a log used outside replicas as well is closed by ``aclose``.
"""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

from app_toolkit._runtime import request_context
from app_toolkit.event_log import (
    EventLog,
    LoggedEvent,
    StreamAbandoned,
    UnknownStream,
    WriterReplaced,
    WrittenStreams,
    check_name,
    lost,
    new_writer,
)

_ID = re.compile(r"(\d{1,20})-(\d{1,20})")
_WAIT_MS = 1000  # longest single XREAD BLOCK; the writer's lease is checked between them

#: Every script gets the keys [stream, lease, end, writer, last] and refuses a named writer
#: (ARGV[1]; "" names none) that another one replaced; the first named is the writer.
_WRITER = """
local function replaced()
  if ARGV[1] == '' then return false end
  local current = redis.call('GET', KEYS[4])
  return current and current ~= ARGV[1]
end
"""
#: ARGV[6] is "1" when this log wrote the stream before: it must still exist.
#: ARGV[5] is the append's token: the stream's latest one is kept with the ids it got
#: ("token id id ..."), and an append bearing that token again (sent again because its
#: answer was lost) gets those ids back, after the word "again", and adds nothing. Checked
#: first: the append was done, whatever happened to the stream since.
_APPEND = (
    _WRITER
    + """
local last = redis.call('GET', KEYS[5])
if last and string.sub(last, 1, #ARGV[5] + 1) == ARGV[5] .. ' ' then
  local done = {'again'}
  for event_id in string.gmatch(string.sub(last, #ARGV[5] + 2), '%S+') do done[#done + 1] = event_id end
  return done
end
if redis.call('EXISTS', KEYS[3]) == 1 then return redis.error_reply('closed') end
if ARGV[6] == '1' and redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('lost') end
if replaced() then return redis.error_reply('replaced') end
local ids = {}
for i = 7, #ARGV, 2 do
  ids[#ids + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[2], '*', 'e', ARGV[i], 'd', ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
redis.call('SET', KEYS[5], ARGV[5] .. ' ' .. table.concat(ids, ' '), 'PX', ARGV[3])
if ARGV[1] ~= '' then redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[3])
else redis.call('PEXPIRE', KEYS[4], ARGV[3]) end
return ids
"""
)
_TOUCH = (
    _WRITER
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('unknown') end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if replaced() then return redis.error_reply('replaced') end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 1
"""
)
_TAKE_OVER = (
    _WRITER
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('unknown') end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[3])
return 1
"""
)
_RELEASE = (
    _WRITER
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('unknown') end
if replaced() then return 0 end
redis.call('DEL', KEYS[2])
return 1
"""
)
_CLOSE = (
    _WRITER
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('unknown') end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if replaced() then return redis.error_reply('replaced') end
redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[2], '*', 'end', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[5], ARGV[3])
redis.call('SET', KEYS[3], '1', 'PX', ARGV[3])
redis.call('DEL', KEYS[2], KEYS[4])
return 1
"""
)


class RedisEventLog(EventLog):
    """Streams kept in Redis (5.0 or later) at ``url`` (``redis://[:password@]host:port/db``,
    ``rediss://`` for TLS). Picklable: a deployment can take it as an argument, and each
    replica opens its own connections on first use."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "app_toolkit:events:",
        max_events: int = 100_000,
        keep_s: float = 300.0,
        writer_timeout_s: float = 60.0,
        max_connections: int = 256,
        pool_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(max_events=max_events, keep_s=keep_s, writer_timeout_s=writer_timeout_s)
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"a Redis URL starts with redis://, rediss:// or unix://, got {url!r}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self.url = url
        self.prefix = prefix
        self.max_connections = max_connections
        self.pool_timeout_s = pool_timeout_s
        self._client: Any = None  # redis.asyncio.Redis, made on first use (in the loop that uses it)
        self._scripts: dict[str, Any] = {}
        self._refused: type[Exception] = Exception  # redis's ResponseError, once imported
        self._written = WrittenStreams()
        #: The replicas that used the log, each by its list of stop hooks (keyed by the
        #: list's id: lists compare by content, and every new replica's list is empty).
        self._replicas: dict[int, list[request_context.StopHook]] = {}
        #: Used outside any replica (a script, the deploying process): closed by aclose only.
        self._used_outside = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_client=None, _scripts={}, _replicas={}, _used_outside=False, _written=WrittenStreams())
        return state

    def _redis(self) -> Any:
        if self._client is None:
            try:
                import redis.asyncio as aioredis
                from redis.asyncio.retry import Retry
                from redis.backoff import NoBackoff
                from redis.exceptions import ConnectionError as ConnectionLost
                from redis.exceptions import ResponseError
            except ImportError as missing:  # pragma: no cover - depends on the install
                raise ImportError(
                    "RedisEventLog needs the redis package: pip install 'app_toolkit[redis]'"
                ) from missing
            pool = aioredis.BlockingConnectionPool.from_url(
                self.url,
                max_connections=self.max_connections,
                timeout=self.pool_timeout_s,
                decode_responses=True,
                socket_connect_timeout=5.0,
                socket_timeout=_WAIT_MS / 1000 + 10.0,  # a blocked XREAD answers within its wait
                # The one retry the module's docstring describes: at once, on the same
                # connection reconnected. Not on timeouts: a Redis slow to answer is not
                # helped by a second command.
                retry=Retry(NoBackoff(), 1, supported_errors=(ConnectionLost,)),
            )
            self._client = aioredis.Redis.from_pool(pool)  # closed with the client
            self._refused = ResponseError
            self._scripts = {
                name: self._client.register_script(body)
                for name, body in (
                    ("append", _APPEND),
                    ("touch", _TOUCH),
                    ("take_over", _TAKE_OVER),
                    ("release", _RELEASE),
                    ("close", _CLOSE),
                )
            }
        self._register_user()
        return self._client

    def _register_user(self) -> None:
        """Notes who uses the client. A replica gets a stop hook that closes the client
        once no replica uses it (the local backend's replicas share one log object); a use
        outside replicas keeps it open until ``aclose``."""
        hooks = request_context.stop_hooks.get()
        if hooks is None:
            self._used_outside = True
        elif id(hooks) not in self._replicas:
            self._replicas[id(hooks)] = hooks
            hooks.append(functools.partial(self._replica_stopped, hooks))

    async def _replica_stopped(self, hooks: list[request_context.StopHook]) -> None:
        del self._replicas[id(hooks)]
        if not self._replicas and not self._used_outside:
            await self.aclose()

    def _keys(self, stream: str) -> list[str]:
        check_name(stream)
        key = f"{self.prefix}{{{stream}}}"  # one hash slot for the five keys (Redis Cluster)
        return [key, key + ":w", key + ":end", key + ":writer", key + ":last"]

    def _ms(self, seconds: float) -> int:
        return max(1, int(seconds * 1000))

    async def append(self, stream: str, data: str, event: str = "", *, writer: str = "") -> str:
        [event_id] = await self.append_many(stream, [(data, event)], writer=writer)
        return event_id

    async def append_many(
        self, stream: str, events: Sequence[tuple[str, str]], *, writer: str = ""
    ) -> list[str]:
        if not events:
            return []
        return await self._append(stream, events, writer, secrets.token_hex(8))

    async def _append(
        self, stream: str, events: Sequence[tuple[str, str]], writer: str, token: str
    ) -> list[str]:
        """Appends ``events`` once per ``token``: sent again with the token of the stream's
        latest append (its answer lost on the way), it returns that append's ids and adds
        nothing. Only the latest token is kept, so what is guaranteed is that a retry of
        the stream's latest append is never applied twice. The connection's one retry
        follows its failed attempt at once, so it is the latest unless another caller
        appended to the same stream in between."""
        keys = self._keys(stream)
        self._redis()
        args: list[Any] = [
            writer,
            self.max_events,
            self._ms(self.writer_timeout_s + self.keep_s),
            self._ms(self.writer_timeout_s),
            token,
            "1" if stream in self._written else "",
        ]
        for data, event in events:
            args += [event, data]
        try:
            ids = [str(event_id) for event_id in await self._scripts["append"](keys=keys, args=args)]
        except self._refused as refused:
            if "lost" in str(refused):
                raise lost(stream) from None  # and at every later append: it stays noted
            if "closed" in str(refused):
                raise ValueError(f"stream {stream!r} is closed") from None
            if "replaced" in str(refused):
                raise WriterReplaced(f"stream {stream!r} is written by another writer now") from None
            raise
        if ids[:1] == ["again"]:
            return ids[1:]  # done before (perhaps closed since): nothing new to note
        self._written.add(stream)
        return ids

    async def touch(self, stream: str, *, writer: str = "") -> None:
        await self._call("touch", stream, [writer, self._ms(self.writer_timeout_s)])

    async def close(self, stream: str, *, writer: str = "") -> None:
        await self._call("close", stream, [writer, self.max_events + 1, self._ms(self.keep_s)])
        self._written.discard(stream)  # closed (a lost one stays noted: its appends raise)

    async def take_over(self, stream: str, *, writer: str = "") -> bool:
        args = [
            writer or new_writer(),
            self._ms(self.writer_timeout_s),
            self._ms(self.writer_timeout_s + self.keep_s),
        ]
        taken = bool(await self._call("take_over", stream, args))
        if taken:
            self._written.add(stream)
        return taken

    async def release(self, stream: str, *, writer: str = "") -> None:
        await self._call("release", stream, [writer])

    async def read(self, stream: str) -> list[LoggedEvent]:
        entries = await self._redis().xrange(self._keys(stream)[0])
        if not entries:
            raise UnknownStream(stream)
        return [
            LoggedEvent(entry_id, fields.get("e", ""), fields.get("d", ""))
            for entry_id, fields in entries
            if "end" not in fields
        ]

    async def _call(self, script: str, stream: str, args: list[Any]) -> Any:
        keys = self._keys(stream)
        self._redis()
        try:
            return await self._scripts[script](keys=keys, args=args)
        except self._refused as refused:
            if "unknown" in str(refused):
                raise UnknownStream(stream) from None
            if "replaced" in str(refused):
                raise WriterReplaced(f"stream {stream!r} is written by another writer now") from None
            raise

    async def _check(self, stream: str, after: str) -> None:
        key, lease, end, _, _ = self._keys(stream)
        if after and _ID.fullmatch(after) is None:
            raise ValueError(f"not an event id of this log: {after!r}")
        async with self._redis().pipeline(transaction=False) as checks:
            newest, writer_alive, closed = (
                await checks.xrevrange(key, count=1).exists(lease).exists(end).execute()
            )
        if not newest:
            raise UnknownStream(stream)
        if after and _order(after) > _order(newest[0][0]):
            raise ValueError(f"stream {stream!r} has no event {after!r} yet")
        if after == newest[0][0] and not writer_alive and not closed:
            raise StreamAbandoned(f"stream {stream!r}: its writer went silent")

    async def _follow(self, stream: str, after: str) -> AsyncIterator[LoggedEvent]:
        key, lease, end, _, _ = self._keys(stream)
        client = self._redis()
        last = after or "0-0"
        wait_ms = min(_WAIT_MS, self._ms(self.writer_timeout_s))
        while True:
            answer = await client.xread({key: last}, count=256, block=wait_ms)
            if answer:
                for entry_id, fields in answer[0][1]:
                    if "end" in fields:
                        return
                    last = entry_id
                    yield LoggedEvent(entry_id, fields.get("e", ""), fields.get("d", ""))
                continue
            async with client.pipeline(transaction=False) as checks:
                writer_alive, closed, kept = await checks.exists(lease).exists(end).exists(key).execute()
            if writer_alive or closed:
                continue  # a closed stream's end entry comes with the next read
            if not kept:
                raise UnknownStream(stream)
            raise StreamAbandoned(f"stream {stream!r}: its writer went silent")

    async def aclose(self) -> None:
        client, self._client, self._scripts, self._used_outside = self._client, None, {}, False
        if client is not None:
            await client.aclose()


def _order(event_id: str) -> tuple[int, int]:
    matched = _ID.fullmatch(event_id)
    if matched is None:
        raise ValueError(f"not an event id of this log: {event_id!r}")
    return int(matched.group(1)), int(matched.group(2))
