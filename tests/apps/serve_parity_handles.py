"""Programs written against Ray Serve's API, part 2 (part 1: ``serve_parity.py``):
deployment options and decorators, handles, errors and overload
(tests/behaviour/test_serve_parity.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.requests import Request

import app_toolkit as serve
from app_toolkit import DeploymentHandle
from tests.apps.serve_parity import mark

# ------------------------------------------------------------------ options and decorators


@serve.deployment(max_ongoing_requests=1, max_queued_requests=1, backpressure_config={"status_code": 429})
class Busy:
    """Each request holds the only slot until the test opens the gate (``open_gate``)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    async def __call__(self) -> str:
        mark(self.folder, "busy")
        gate = Path(self.folder) / "open"
        async with asyncio.timeout(60):  # the test opens it; bounded all the same
            while not gate.exists():
                await asyncio.sleep(0.02)
        return "done"


def open_gate(folder: str) -> None:
    """Let :class:`Busy`'s requests finish."""
    (Path(folder) / "open").touch()


@serve.deployment("named_first", num_replicas=1)
class NamedFirst:
    def __call__(self) -> str:
        return "named"


@serve.deployment
class BareBatch:
    @serve.batch
    async def handle(self, items: list[int]) -> list[int]:
        return [item * 2 for item in items]

    async def __call__(self, request: Request) -> int:
        return await self.handle(int(request.query_params["x"]))


@serve.deployment(max_ongoing_requests=100)
class BatchedModels:
    """Batches of one multiplexed model id each, as Ray Serve splits them."""

    @serve.multiplexed(max_num_models_per_replica=4)
    async def get_model(self, model_id: str) -> str:
        return model_id

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.2)
    async def run(self, items: list[str]) -> list[str]:
        batch_model = serve.get_multiplexed_model_id()
        models = {await self.get_model(item) for item in items}
        return [f"{batch_model}:{','.join(sorted(models))}:{len(items)}" for _ in items]

    async def __call__(self) -> str:
        return await self.run(serve.get_multiplexed_model_id())


@serve.deployment(num_replicas=2)
class Ranked:
    """Declares ``rank`` in reconfigure: Ray Serve calls it at start, with no user_config
    too, and passes the replica's ReplicaRank."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, serve.ReplicaRank | None]] = []

    def reconfigure(self, user_config: object, rank: serve.ReplicaRank | None) -> None:
        self.calls.append((user_config, rank))

    def calls_seen(self) -> list[tuple[object, int, int, int, bool]]:
        context_rank = serve.get_replica_context().rank
        return [
            (config, rank.rank, rank.node_rank, rank.local_rank, rank == context_rank)
            for config, rank in self.calls
            if rank is not None
        ]


@serve.deployment
class ContextFields:
    """Reads get_replica_context() as a Ray Serve 2.60 program does: in its constructor
    (servable_object None there) and in a call."""

    def __init__(self) -> None:
        self.in_constructor = serve.get_replica_context().servable_object

    def fields(self) -> dict[str, object]:
        context = serve.get_replica_context()
        replica_id = context.replica_id
        return {
            "unique_id": replica_id.unique_id,
            "replica_tag": context.replica_tag,
            "deployment": (replica_id.deployment_id.app_name, replica_id.deployment_id.name),
            "full_id": replica_id.to_full_id_str(),
            "is_me": context.servable_object is self,
            "in_constructor": self.in_constructor,
            "code_version": context.code_version,
            "gang_context": context.gang_context,
            "id": str(replica_id),
        }


@serve.deployment(graceful_shutdown_timeout_s=0.2)
class Hangs:
    """Never answers: stopped past its grace period, its call is lost."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    async def __call__(self) -> str:
        mark(self.folder, "hangs")
        await asyncio.Event().wait()
        return "never"

    async def items(self) -> AsyncIterator[str]:
        yield "first"
        mark(self.folder, "streams")
        await asyncio.Event().wait()


# ------------------------------------------------------------------ handles and errors


@serve.deployment
class Methods:
    def known(self) -> str:
        return "known"

    async def blocks(self, other: DeploymentHandle) -> str:
        return str(other.known.remote().result())  # a sync wait inside async code

    def fails(self) -> str:
        raise ValueError("secret detail that must not reach the client")


@serve.deployment
class CrossApp:
    """Handles to another application, made in the constructor and in a method."""

    def __init__(self, other_app: str) -> None:
        self.other_app = other_app
        self.at_start = serve.get_app_handle(other_app)

    async def __call__(self) -> str:
        later = serve.get_deployment_handle("Downstream", app_name=self.other_app)
        return f"{await self.at_start.remote()}|{await later.remote()}"


# ------------------------------------------------------------------ overload and nested responses


@serve.deployment(max_ongoing_requests=1, max_queued_requests=1)
class Narrow:
    """One request at a time and one waiting: a third is refused (BackPressureError)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def ping(self) -> str:
        return "pong"

    async def __call__(self) -> str:
        mark(self.folder, "narrow")
        await asyncio.sleep(1)
        return "done"


@serve.deployment
class CallsNarrow:
    """A plain HTTP deployment that does not catch its downstream's BackPressureError."""

    def __init__(self, narrow: DeploymentHandle) -> None:
        self.narrow = narrow

    async def __call__(self, request: Request) -> str:
        if "warm" in request.query_params:  # the caller learns the downstream's limits
            return str(await self.narrow.ping.remote())
        return str(await self.narrow.remote())


@serve.deployment
class Echo:
    def echo(self, value: object) -> object:
        return value


@serve.deployment
class PassesNested:
    """Passes a response inside a list: Ray Serve refuses it (only top-level ones resolve)."""

    def __init__(self, echo: DeploymentHandle) -> None:
        self.echo = echo

    async def __call__(self) -> object:
        return await self.echo.echo.remote([self.echo.echo.remote(1)])

    async def top_level(self) -> object:
        return await self.echo.echo.remote(self.echo.echo.remote(1))
