"""Calls between the scale benchmark's controller process and its caller processes.

A stand-in for Ray's actor calls: a TCP connection on 127.0.0.1 per caller, each call and answer one
length-prefixed pickle. It pickles arguments and results in the controller's process as
Ray would, so the controller's CPU and memory figures include that cost.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import struct
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("benchmarks.scale")

_LENGTH = struct.Struct("!I")
#: The largest message either side accepts (a whole table of 10,000 replicas is ~1 MB).
MAX_MESSAGE = 64 * 1024 * 1024

Handler = Callable[..., Awaitable[Any]]


async def _read(reader: asyncio.StreamReader) -> Any:
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_MESSAGE:
        raise ValueError(f"message of {length} bytes is over {MAX_MESSAGE}")
    return pickle.loads(await reader.readexactly(length))


def _write(writer: asyncio.StreamWriter, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.writelines((_LENGTH.pack(len(data)), data))


async def serve(handlers: dict[str, Handler]) -> tuple[asyncio.Server, int]:
    """Answer calls ``(call_id, method, args)`` with ``(call_id, error, result)`` on a
    free port of 127.0.0.1; returns the server and its port."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks: set[asyncio.Task[None]] = set()

        async def answer(call_id: int, method: str, args: tuple[Any, ...]) -> None:
            try:
                result, error = await handlers[method](*args), None
            except Exception as exc:  # noqa: BLE001 - sent back to the caller
                result, error = None, repr(exc)
            _write(writer, (call_id, error, result))

        try:
            while True:
                call_id, method, args = await _read(reader)
                task = asyncio.get_running_loop().create_task(answer(call_id, method, args))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:
            logger.exception("Reading a caller's calls failed")
        finally:
            for task in tasks:
                task.cancel()
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0, limit=MAX_MESSAGE)
    port: int = server.sockets[0].getsockname()[1]
    return server, port


class Client:
    """One caller's connection to the controller process."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._reading = asyncio.get_running_loop().create_task(self._read_answers(reader))

    @classmethod
    async def connect(cls, port: int) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=MAX_MESSAGE)
        return cls(reader, writer)

    async def call(self, method: str, *args: Any) -> Any:
        call_id = next(self._ids)
        answer = self._waiting[call_id] = asyncio.get_running_loop().create_future()
        _write(self._writer, (call_id, method, args))
        try:
            return await answer
        finally:
            self._waiting.pop(call_id, None)

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                call_id, error, result = await _read(reader)
                answer = self._waiting.get(call_id)
                if answer is None or answer.done():
                    continue
                if error is None:
                    answer.set_result(result)
                else:
                    answer.set_exception(RuntimeError(error))
        except Exception as exc:
            if not isinstance(exc, asyncio.IncompleteReadError | ConnectionError):
                logger.exception("Reading the controller's answers failed")
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(ConnectionError(f"controller went away: {exc!r}"))

    def close(self) -> None:
        self._reading.cancel()
        self._writer.close()
