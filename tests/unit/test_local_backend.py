"""The local backend's replicas: a replica stopped with requests still running loses
them, as a stopped process does on Ray; its context is Ray Serve's; its numerical
libraries take the threads Ray would give its process."""

from __future__ import annotations

import asyncio
import os
import sys
import types

import pytest

import app_toolkit as tk
from app_toolkit._runtime.backends.cpu_threads import ProcessThreads
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
from app_toolkit.config import DeploymentConfig, RayActorOptions
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


def _spec(
    backend: LocalBackend, definition: object, num_cpus: float = 0, version: str = "v1"
) -> DeploymentSpec:
    config = DeploymentConfig(ray_actor_options=RayActorOptions(num_cpus=num_cpus))
    return DeploymentSpec(
        DeploymentID("app", "D"), backend.store(definition), backend.store(((), {})), config, False, version
    )


def _seat() -> Seat:
    return Seat(0, 1, lambda node: tk.ReplicaRank(0, 0, 0))


class Reads:
    """What its constructor sees: its replica context's instance, OMP_NUM_THREADS."""

    def __init__(self) -> None:
        self.servable_in_constructor = tk.get_replica_context().servable_object
        self.omp = os.environ.get("OMP_NUM_THREADS")

    def __call__(self) -> tuple[object, str | None]:
        return tk.get_replica_context().servable_object, tk.get_replica_context().code_version


async def test_the_replica_context_names_the_instance_once_built_and_the_code_version() -> None:
    backend = LocalBackend()
    backend.threads = ProcessThreads()
    _, core = await backend.start_replica("app.D.ab12", _spec(backend, Reads, version="8c1d"), _seat())
    assert isinstance(core.instance, Reads)
    assert core.instance.servable_in_constructor is None  # as in Ray Serve: not built yet
    assert core.context.servable_object is core.instance and core.context.code_version == "8c1d"
    assert (core.context.replica_id, core.context.replica_tag) == ("app.D.ab12", "ab12")
    await backend.stop_replica(core, graceful=False)


class FakeTorch(types.ModuleType):
    """Records the thread counts set, as torch.set_num_threads would take them."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.threads = 8  # one per core: torch's own count before anyone set it
        self.calls: list[int] = []

    def get_num_threads(self) -> int:
        return self.threads

    def set_num_threads(self, threads: int) -> None:
        self.calls.append(threads)
        self.threads = threads


async def test_replicas_get_rays_omp_threads_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray sets OMP_NUM_THREADS in a replica's process to its num_cpus rounded down, at
    # least 1; the local backend's replicas share this process: the largest count applies,
    # torch (imported already) is told too, and the process's values come back at the end.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    backend = LocalBackend()
    backend.threads = ProcessThreads()
    _, small = await backend.start_replica("small", _spec(backend, Reads), _seat())
    assert isinstance(small.instance, Reads) and small.instance.omp == "1"  # num_cpus 0 (the default): 1
    _, big = await backend.start_replica("big", _spec(backend, Reads, num_cpus=2.5), _seat())
    assert isinstance(big.instance, Reads) and big.instance.omp == "2"
    assert torch.calls == [1, 2]
    await backend.stop_replica(big, graceful=False)
    assert (os.environ.get("OMP_NUM_THREADS"), torch.threads) == ("1", 1)
    await backend.stop_replica(small, graceful=False)
    assert (os.environ.get("OMP_NUM_THREADS"), torch.threads) == (None, 8)


async def test_the_processes_own_omp_threads_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # as on Ray, where a value already set stays
    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    backend = LocalBackend()
    backend.threads = ProcessThreads()
    _, core = await backend.start_replica("r", _spec(backend, Reads, num_cpus=2), _seat())
    assert isinstance(core.instance, Reads) and core.instance.omp == "3"
    await backend.stop_replica(core, graceful=False)
    assert (os.environ.get("OMP_NUM_THREADS"), torch.calls) == ("3", [])
