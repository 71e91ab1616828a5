"""The local backend's replicas: a replica stopped with requests still running loses
them, as a stopped process does on Ray."""

from __future__ import annotations

import asyncio

import pytest

import app_toolkit as tk
from app_toolkit._runtime.backends.local import LocalBackend, LocalReplicaClient
from app_toolkit._runtime.controller.backend import Seat
from app_toolkit._runtime.messages import (
    CallFailure,
    DeploymentID,
    DeploymentSpec,
    MethodCall,
    ReplicaLost,
    StreamItem,
)
from app_toolkit.config import DeploymentConfig
from tests.waiting import wait_for_async

pytestmark = pytest.mark.anyio


class Stubborn:
    """Turns its cancellation into an error (which must not reach a caller that lost it)."""

    async def __call__(self) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ValueError("cancelled") from None
        return "never"

    async def items(self) -> object:
        yield "first"
        await asyncio.Event().wait()


async def test_a_stopped_replicas_requests_are_lost_cancelled_and_awaited() -> None:
    backend = LocalBackend()
    spec = DeploymentSpec(
        DeploymentID("app", "D"),
        backend.store(Stubborn),
        backend.store(((), {})),
        DeploymentConfig(),
        False,
        "v1",
    )
    _, core = await backend.start_replica("r", spec, Seat(0, 1, lambda node: tk.ReplicaRank(0, 0, 0)))
    client = LocalReplicaClient(backend, "r")
    unary = await client.open(MethodCall("1", "__call__", ()))
    stream = await client.open(MethodCall("2", "items", (), stream=True))
    assert isinstance(await stream.recv(), StreamItem)
    await wait_for_async(lambda: len(client.serving) == 2, 5, "both requests to run")
    tasks = list(client.serving.values())
    await backend.stop_replica(core, graceful=False)
    assert all(task.done() for task in tasks) and not client.serving  # cancelled and awaited
    for exchange in (unary, stream):
        assert isinstance(await exchange.recv(), ReplicaLost)
        assert not exchange.take_ready(CallFailure)  # no failure after the loss
