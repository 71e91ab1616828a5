"""Programs written against Ray Serve's API (``from ray import serve``, import swapped),
each showing one behaviour Ray Serve's own test suite expects (tests/behaviour/test_serve_parity.py):
calls, streams, constructors, ingress forms and teardown (options, handles and errors are
in ``serve_parity_handles.py``).

Teardown hooks write marker files into a folder the test gives the deployment, so they
can be seen from the test on either backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from starlette.requests import Request

import app_toolkit as serve
from app_toolkit import DeploymentHandle

# ------------------------------------------------------------------ calls without a request


@serve.deployment
def no_params() -> str:
    return "called without the request"


@serve.deployment
class NoParamsCall:
    def __call__(self) -> str:
        return "__call__ without the request"


# ------------------------------------------------------------------ streams


def _chunks(count: int, fail_at: int | None) -> Iterator[str]:
    for number in range(count):
        if number == fail_at:
            raise RuntimeError("the generator failed mid-stream")
        yield f"hi_{number}"


@serve.deployment
class Streamer:
    async def __call__(self, request: Request) -> StreamingResponse:
        fail_at = request.query_params.get("fail_at")
        chunks = _chunks(10, int(fail_at) if fail_at is not None else None)
        return StreamingResponse(chunks, media_type="text/plain")

    def items(self, count: int) -> Iterator[str]:
        yield from _chunks(count, None)


stream_app = FastAPI()


@serve.deployment
@serve.ingress(stream_app)
class ReStreamer:
    """Re-streams what a streaming handle yields, chunk by chunk."""

    def __init__(self, streamer: DeploymentHandle) -> None:
        self.streamer = streamer.options(stream=True)

    @stream_app.get("/")
    async def relay(self) -> StreamingResponse:
        async def chunks() -> AsyncIterator[str]:
            async for item in self.streamer.items.remote(5):
                yield item

        return StreamingResponse(chunks(), media_type="text/plain")


# ------------------------------------------------------------------ constructors


@serve.deployment
class AsyncInit:
    async def __init__(self, greeting: str) -> None:  # type: ignore[misc] # Ray Serve awaits it
        await asyncio.sleep(0.01)
        self.greeting = greeting

    def __call__(self) -> str:
        return self.greeting


@serve.deployment
class Downstream:
    def __init__(self, word: str) -> None:
        self.word = word

    def __call__(self) -> str:
        return self.word


@serve.deployment
class Upstream:
    """Gets two bindings of one class: Ray Serve names the second Downstream_1."""

    def __init__(self, first: DeploymentHandle, second: DeploymentHandle) -> None:
        self.first, self.second = first, second

    async def __call__(self) -> str:
        return f"{await self.first.remote()} {await self.second.remote()}"


class Holder:
    """A user object carrying a bound deployment in an attribute."""

    def __init__(self, inner: object) -> None:
        self.inner = inner


@serve.deployment
class UsesHolder:
    def __init__(self, *holders: Any) -> None:
        self.holders = holders

    async def __call__(self) -> str:
        handles = [holder.inner for holder in self.holders]
        assert all(isinstance(handle, DeploymentHandle) for handle in handles), handles
        return " ".join([str(await handle.remote()) for handle in handles])


# ------------------------------------------------------------------ ingress forms


def build_asgi_app() -> FastAPI:
    """Ray Serve evaluates a builder on each replica, with no arguments."""
    app = FastAPI()

    @app.get("/built")
    def built() -> str:
        return "built on the replica"

    return app


BuiltIngress = serve.deployment(serve.ingress(build_asgi_app)())

shared_app = FastAPI()


@serve.deployment
@serve.ingress(shared_app)
class SharedOne:
    @shared_app.get("/one")
    def one(self) -> str:
        return "one"


@serve.deployment
@serve.ingress(shared_app)
class SharedTwo:
    @shared_app.get("/two")
    def two(self) -> str:
        return "two"


# ------------------------------------------------------------------ teardown


def mark(folder: str, name: str) -> None:
    (Path(folder) / name).write_text("done")


class Resource:
    def __init__(self, folder: str, name: str) -> None:
        self.folder, self.name = folder, name

    def __del__(self) -> None:
        mark(self.folder, self.name)


@serve.deployment(graceful_shutdown_timeout_s=1)
class Finalized:
    def __init__(self, folder: str, version: int = 1) -> None:
        self.folder = folder
        self.version = version

    def __call__(self) -> int:
        return self.version

    def __del__(self) -> None:
        mark(self.folder, f"del-{self.version}")


@serve.deployment(graceful_shutdown_timeout_s=1)
class AsyncFinalized:
    """An ``async def __del__``: awaited when the replica stops, and run once only."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self) -> str:
        return "here"

    async def __del__(self) -> None:
        await asyncio.sleep(0.05)  # really awaited: a coroutine never awaited does nothing
        with (Path(self.folder) / "async-del").open("a") as marks:
            marks.write("ran\n")


def make_lifespan_app(folder: str, version: int) -> serve.Application:
    """A FastAPI app whose lifespan shutdown leaves a marker (delete, redeploy)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        mark(folder, f"lifespan-{version}")

    app = FastAPI(lifespan=lifespan)

    @app.get("/")
    def root() -> int:
        return version

    return serve.deployment(serve.ingress(app)()).options(graceful_shutdown_timeout_s=1).bind()


@serve.deployment
class Recorder:
    """Another deployment of the models' application, that their release calls."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def record(self, what: str) -> None:
        mark(self.folder, f"recorded-{what}")


class RecordedResource:
    def __init__(self, name: str, recorder: serve.DeploymentHandle) -> None:
        self.name, self.recorder = name, recorder

    async def aclose(self) -> None:
        await self.recorder.record.remote(self.name)


@serve.deployment(graceful_shutdown_timeout_s=1)
class Models:
    def __init__(self, folder: str, version: int = 1, recorder: serve.DeploymentHandle | None = None) -> None:
        self.folder, self.version, self.recorder = folder, version, recorder

    @serve.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str) -> Resource | RecordedResource:
        """A model whose id starts with "recorded" reports its release to the Recorder."""
        name = f"model-{model_id}-v{self.version}"
        if self.recorder is not None and model_id.startswith("recorded"):
            return RecordedResource(name, self.recorder)
        return Resource(self.folder, name)

    async def __call__(self) -> str:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.name
