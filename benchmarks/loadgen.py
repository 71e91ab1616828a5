"""A small HTTP/1.1 load generator on raw asyncio sockets (keep-alive, GET only) that
records each response's status, latency and Retry-After, for the overload and soak
benchmarks. Open loop (a fixed arrival rate, whatever the server does) or closed loop
(a number of clients, each waiting for its answer)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

from benchmarks.percentile import percentile


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int  # 0: no answer (refused, reset, timed out): see ``error``
    seconds: float
    retry_after: str | None
    error: str = ""


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)

    def statuses(self) -> Counter[int]:
        return Counter(outcome.status for outcome in self.outcomes)

    def errors(self) -> Counter[str]:
        return Counter(outcome.error for outcome in self.outcomes if outcome.status == 0)

    def percentile_ms(self, status: int, share: float) -> float:
        return percentile((o.seconds for o in self.outcomes if o.status == status), share) * 1000

    def median_ms(self, status: int) -> float:
        times = [o.seconds for o in self.outcomes if o.status == status]
        return statistics.median(times) * 1000 if times else 0.0


class Client:
    """Keep-alive connections to one server, reused across requests."""

    def __init__(self, host: str, port: int, timeout_s: float = 30.0) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, path: str) -> Outcome:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                status, retry_after = await self._exchange(path)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
            return Outcome(0, time.perf_counter() - started, None, f"{type(exc).__name__}: {exc}")
        return Outcome(status, time.perf_counter() - started, retry_after)

    async def _exchange(self, path: str) -> tuple[int, str | None]:
        reused = bool(self._idle)
        if reused:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nhost: {self.host}\r\n\r\n".encode())
            try:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as exc:
                if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                    raise
                # The server closed this idle connection (keep-alive timeout) as we reused
                # it; nothing was read, so, as HTTP clients do, try once on a new one.
                writer.close()
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(f"GET {path} HTTP/1.1\r\nhost: {self.host}\r\n\r\n".encode())
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            lines = head.split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
            await reader.readexactly(int(headers.get("content-length", "0")))
        except BaseException:
            writer.close()
            raise
        if headers.get("connection") == "close":
            writer.close()
        else:
            self._idle.append((reader, writer))
        return status, headers.get("retry-after")

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


async def open_loop(client: Client, path: str, rate: float, duration_s: float) -> Tally:
    """Start ``rate`` requests a second for ``duration_s``, whether or not earlier ones
    were answered; wait for every one."""
    tally = Tally()
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        tally.outcomes.append(await client.get(path))

    loop = asyncio.get_running_loop()
    start = loop.time()
    sent = 0
    while (elapsed := loop.time() - start) < duration_s:
        for _ in range(int(elapsed * rate) - sent):
            task = loop.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        await asyncio.sleep(0.005)
    if tasks:
        await asyncio.wait(tasks)
    return tally


async def closed_loop(client: Client, path: str, clients: int, duration_s: float) -> Tally:
    """``clients`` loops, each sending its next request when the last is answered."""
    tally = Tally()
    loop = asyncio.get_running_loop()
    end = loop.time() + duration_s

    async def worker() -> None:
        while loop.time() < end:
            tally.outcomes.append(await client.get(path))

    await asyncio.gather(*(worker() for _ in range(clients)))
    return tally
