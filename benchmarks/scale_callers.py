"""The simulated callers of the scale benchmark, in a process of their own.

Each caller stands for one node's proxy: a real ``TableSubscriber`` following the
application table and every application's ingress table over its own connection to the
controller process (``scale_wire.py``), and reporting the load of the deployments it is
busy with every half second. What a caller does with a table is simulated: it keeps the
replica ids.

The benchmark's process steers these processes over a pipe:

- ``("ready", {key: count})``: answer once every caller holds that many replicas per key;
- ``("without", key, replica_id)``: answer, with ``time.monotonic()`` then, once every
  caller's table of ``key`` has left the replica out;
- ``("stop",)``: close everything and end.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.messages import DeploymentID, Request
from app_toolkit._runtime.routing.subscriber import LOAD_REPORT_PERIOD_S, TableSubscriber
from app_toolkit._runtime.tables import APPLICATIONS_KEY, ReplicaTable, Table, Updates, Versions, replicas_key
from app_toolkit.exceptions import ReplicaUnavailableError
from benchmarks.scale_wire import Client

#: How often the time of a change is checked (a few callers' tables of one key).
_POLL_S = 0.002
#: How often the whole set of tables is checked (every caller, every key: slow at scale).
_READY_POLL_S = 0.5


class _NoReplica:
    """The simulated callers never send requests; a connection is never opened."""

    async def open(self, request: Request) -> Exchange:
        raise ReplicaUnavailableError("simulated")

    def close(self) -> None:
        pass


class Caller:
    """One simulated proxy."""

    def __init__(self, client: Client, keys: list[str]) -> None:
        self.client = client
        self.held: dict[str, frozenset[str]] = {}
        self.subscriber = TableSubscriber(self._listen, lambda info: _NoReplica())
        self.subscriber.watch(APPLICATIONS_KEY, lambda table: None)
        for key in keys:
            self.subscriber.watch(key, lambda table, key=key: self._hold(key, table))  # type: ignore[misc]

    async def _listen(self, known: Versions, timeout_s: float) -> Updates:
        updates: Updates = await self.client.call("listen", known, timeout_s)
        return updates

    def _hold(self, key: str, table: Table | None) -> None:
        replicas = table.replicas if isinstance(table, ReplicaTable) else ()
        self.held[key] = frozenset(info.replica_id for info in replicas)

    async def report_loads(self, busy: list[DeploymentID], caller_id: str) -> None:
        """Report a small, changing load for ``busy`` every half second (the autoscaler
        keeps each deployment at its minimum for loads this small)."""
        while True:
            await asyncio.sleep(LOAD_REPORT_PERIOD_S)
            loads = {deployment: float(random.randint(1, 3)) for deployment in busy}
            await self.client.call("record_load", caller_id, loads, ())

    def close(self) -> None:
        self.subscriber.close()
        self.client.close()


async def _until(condition: Callable[[], bool], poll_s: float = _POLL_S) -> float:
    while not condition():
        await asyncio.sleep(poll_s)
    return time.monotonic()


def _holding(callers: list[Caller], counts: dict[str, int]) -> Callable[[], bool]:
    return lambda: all(len(c.held.get(k, ())) == n for c in callers for k, n in counts.items())


def _left_out(callers: list[Caller], key: str, replica_id: str) -> Callable[[], bool]:
    return lambda: all(replica_id not in c.held.get(key, ()) for c in callers)


async def _main(
    port: int, count: int, ingresses: list[DeploymentID], busy_fraction: float, pipe: Connection
) -> None:
    keys = [replicas_key(d) for d in ingresses]
    callers = [Caller(await Client.connect(port), keys) for _ in range(count)]
    busy = ingresses[: int(len(ingresses) * busy_fraction)]
    reporters = [
        asyncio.get_running_loop().create_task(caller.report_loads(busy, f"caller-{id(caller)}"))
        for caller in callers
    ]
    loop = asyncio.get_running_loop()
    try:
        while True:
            command = await loop.run_in_executor(None, pipe.recv)
            if command[0] == "ready":
                pipe.send(await _until(_holding(callers, command[1]), _READY_POLL_S))
            elif command[0] == "without":
                pipe.send(await _until(_left_out(callers, command[1], command[2])))
            else:
                break
    finally:
        for task in reporters:
            task.cancel()
        for caller in callers:
            caller.close()


def run(port: int, count: int, ingresses: list[DeploymentID], busy_fraction: float, pipe: Connection) -> None:
    """The process's entry point (multiprocessing, spawn)."""
    asyncio.run(_main(port, count, ingresses, busy_fraction, pipe))
