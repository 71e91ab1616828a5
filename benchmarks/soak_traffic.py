"""The soak's clients: each loop sends one kind of traffic until the end and leaves a
:class:`~benchmarks.soak_rules.Record` per request, everything in it checked (digests,
event numbers, every word of a chat reply)."""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from websockets.exceptions import ConnectionClosed, InvalidMessage

import app_toolkit as tk
from benchmarks.soak_processes import ProxyFinder
from benchmarks.soak_rules import Record

TIMEOUT_S = 30.0
#: Requests per connection: clients reconnect this often, so the kernel spreads their
#: connections over the nodes' proxies.
PER_CONNECTION = 25
SSE_EVENTS = 20
REPLY_EVENTS = 30
#: A resumable reply's client retries this long after a cut before giving up.
RESUME_FOR_S = 20.0
#: A client waits this long after a failure (as clients back off) before it tries again.
RETRY_AFTER_FAILURE_S = 0.1
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike november".split()


@dataclass
class Traffic:
    """What every loop shares: where to send, where to record, and when to stop."""

    port: int
    end: float
    records: list[Record]
    proxies: ProxyFinder
    seed: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def done(self) -> bool:
        return time.monotonic() >= self.end


def failure(exc: BaseException) -> tuple[str, str]:
    """(outcome, detail) of an exception a client raised."""
    detail = f"{type(exc).__name__}: {exc}"
    causes = (exc, exc.__cause__, exc.__context__)
    if isinstance(exc, (httpx.TimeoutException, TimeoutError)):
        return "timeout", detail
    if isinstance(exc, httpx.ConnectError) or any(isinstance(c, ConnectionRefusedError) for c in causes):
        return "refused", detail
    if any(isinstance(c, ConnectionResetError) for c in causes) or "reset" in detail.lower():
        return "reset", detail
    closed = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, ConnectionClosed, InvalidMessage)
    if isinstance(exc, closed):  # InvalidMessage: a WebSocket's handshake cut before its answer
        return "closed", detail
    return "error", detail


def note_server(record: Record, response: httpx.Response, proxies: ProxyFinder) -> None:
    """Who answered: the replica's headers, and the proxy holding the connection."""
    record.head = True
    record.node = response.headers.get("x-node", "")
    record.replica = response.headers.get("x-replica", "")
    stream = response.extensions.get("network_stream")
    try:
        address = stream.get_extra_info("client_addr") if stream is not None else None
    except OSError:  # the connection closed already (an answer with connection: close)
        address = None
    if address:
        record.proxy_node = proxies.node_of(address[1]) or record.proxy_node


def finish(traffic: Traffic, record: Record, outcome: str = "", detail: str = "", status: int = 0) -> None:
    if outcome:
        record.outcome, record.detail, record.status = outcome, detail, status
    record.end = time.monotonic()
    traffic.records.append(record)


@asynccontextmanager
async def _client(traffic: Traffic) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=traffic.base, timeout=TIMEOUT_S, limits=limits) as client:
        yield client


Exchange = Callable[[httpx.AsyncClient, Record, random.Random], Any]


async def run_loop(traffic: Traffic, kind: str, exchange: Exchange, number: int) -> None:
    """``exchange`` over and over on a client that reconnects every PER_CONNECTION requests."""
    rng = random.Random(f"{traffic.seed}:{kind}:{number}")
    while not traffic.done():
        async with _client(traffic) as client:
            for _ in range(PER_CONNECTION):
                if traffic.done():
                    return
                record = Record(kind, time.monotonic())
                try:
                    await exchange(client, record, rng)
                except Exception as exc:  # noqa: BLE001 - every failure is recorded and judged
                    finish(traffic, record, *failure(exc))
                else:
                    finish(traffic, record)
                if record.outcome != "intact":
                    await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                    break  # a new connection for the next one


async def _expect(record: Record, response: httpx.Response, traffic: Traffic, status: int = 200) -> bool:
    """Whether the response has ``status``; if not, the record says what came instead."""
    note_server(record, response, traffic.proxies)
    if response.status_code != status:
        await response.aread()
        record.outcome, record.status = "status", response.status_code
        record.detail = response.text[:300]
        return False
    return True


def http_exchange(traffic: Traffic) -> Exchange:
    async def exchange(client: httpx.AsyncClient, record: Record, rng: random.Random) -> None:
        response = await client.get("/work", params={"ms": 1})
        if await _expect(record, response, traffic) and "spins" not in response.json():
            record.outcome, record.detail = "corrupt", response.text[:300]

    return exchange


def upload_exchange(traffic: Traffic) -> Exchange:
    async def exchange(client: httpx.AsyncClient, record: Record, rng: random.Random) -> None:
        body = rng.randbytes(rng.randint(10_000, 600_000))
        response = await client.post("/upload", content=body)
        if await _expect(record, response, traffic):
            said = response.json()
            if said != {"sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)}:
                record.outcome, record.detail = "corrupt", f"sent {len(body)} bytes, the server read {said}"

    return exchange


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, str]]:
    """SSE events as dicts of their fields (comments skipped)."""
    event: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")
    if event:
        yield event


def check_sequence(got: list[str], count: int) -> str:
    """ "" if ``got`` is "0".."count-1" or a prefix of it; else what is wrong."""
    want = [str(n) for n in range(count)]
    if got != want[: len(got)] or len(got) > count:
        return f"events out of order, repeated or wrong: {got[:40]}"
    return ""


def sse_exchange(traffic: Traffic) -> Exchange:
    async def exchange(client: httpx.AsyncClient, record: Record, rng: random.Random) -> None:
        got: list[str] = []
        async with client.stream("GET", "/sse", params={"events": SSE_EVENTS}) as response:
            if not await _expect(record, response, traffic):
                return
            try:
                async for event in _events(response):
                    if "data" in event:
                        got.append(event["data"])
            except httpx.HTTPError as exc:
                record.outcome, record.detail = failure(exc)
        if wrong := check_sequence(got, SSE_EVENTS):
            record.outcome, record.detail = "corrupt", wrong
        elif record.outcome == "intact" and len(got) < SSE_EVENTS:
            record.outcome, record.detail = "closed", f"ended after {len(got)} of {SSE_EVENTS} events"

    return exchange


async def handle_loop(traffic: Traffic, handle: tk.DeploymentHandle) -> None:
    number = 0
    while not traffic.done():
        number += 1
        record = Record("handle", time.monotonic())
        try:
            async with asyncio.timeout(TIMEOUT_S):
                result = await handle.add.remote(number, 1)
        except tk.RequestLostError as exc:
            finish(traffic, record, "status", f"RequestLostError: {exc}", 502)
        except (tk.ReplicaUnavailableError, tk.BackPressureError) as exc:
            finish(traffic, record, "status", f"{type(exc).__name__}: {exc}", 503)
        except Exception as exc:  # noqa: BLE001 - every failure is recorded and judged
            finish(traffic, record, *failure(exc))
        else:
            wrong = result != number + 1
            finish(traffic, record, *(("corrupt", f"{number} + 1 = {result}") if wrong else ()))
