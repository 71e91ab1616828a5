"""Apps the behaviour tests deploy (importable by Ray workers)."""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

import app_toolkit as tk
from tests.deployments import as_deployment

# ----------------------------------------------------------------- an ordinary router


class Item(BaseModel):
    name: str
    price: float


class TeapotError(Exception):
    pass


def common_tag(tag: str = "none") -> str:
    return tag.upper()


router = APIRouter()


@router.get("/items/{item_id}")
async def read_item(item_id: int, tag: str = Depends(common_tag)) -> dict[str, Any]:
    return {"item_id": item_id, "tag": tag}


@router.post("/items")
def create_item(item: Item) -> Item:
    return item


@router.get("/boom")
async def boom() -> None:
    raise RuntimeError("secret internals")


@router.get("/forbidden")
async def forbidden() -> None:
    raise HTTPException(status_code=403, detail="no entry")


@router.get("/teapot")
async def teapot() -> None:
    raise TeapotError()


@router.get("/state")
async def state(request: Request) -> dict[str, Any]:
    return {
        "replica": request.state.replica_token,
        "middleware": request.state.seen_by_middleware,
        "request_id": tk.get_request_id(),
        "headers": [
            [key.decode("latin-1"), value.decode("latin-1")] for key, value in request.scope["headers"]
        ],
        "root_path": request.scope.get("root_path"),
    }


@router.websocket("/state")
async def state_ws(websocket: WebSocket) -> None:
    """The headers a WebSocket's handshake reached the app with, and its request id."""
    await websocket.accept()
    headers = [[key.decode("latin-1"), value.decode("latin-1")] for key, value in websocket.scope["headers"]]
    await websocket.send_json({"request_id": tk.get_request_id(), "headers": headers})
    await websocket.close()


@router.get("/sleep")
async def sleep(seconds: float = 1.0, marker: str = "", cancelled: str = "") -> dict[str, float]:
    # Marker files let a test see the request start / be cancelled (replicas share the disk).
    if marker:
        Path(marker).touch()
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        if cancelled:
            Path(cancelled).touch()
        raise
    return {"slept": seconds}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    # Runs once per replica: a token that tells the replicas apart.
    yield {"replica_token": f"{os.getpid()}-{uuid.uuid4().hex[:6]}"}


def make_fastapi() -> FastAPI:
    app = FastAPI(lifespan=lifespan)
    app.include_router(router)

    @app.middleware("http")
    async def mark(request: Request, call_next: Any) -> Any:
        request.state.seen_by_middleware = True
        response = await call_next(request)
        response.headers["x-middleware"] = "yes"
        return response

    @app.exception_handler(TeapotError)
    async def teapot_handler(request: Request, exc: TeapotError) -> JSONResponse:
        return JSONResponse({"detail": "I am a teapot"}, status_code=418)

    return app


def make_app(**options: Any) -> tk.App:
    return tk.App(make_fastapi(), **options)


# ----------------------------------------------------------------- failing startup


@asynccontextmanager
async def failing_lifespan(app: FastAPI) -> AsyncIterator[None]:
    raise RuntimeError("database unreachable")
    yield


def make_failing_app() -> tk.App:
    return tk.App(FastAPI(lifespan=failing_lifespan))


@tk.deployment
class BrokenConstructor:
    def __init__(self) -> None:
        raise ValueError("model file missing")

    def __call__(self, request: Request) -> str:
        return "never"


# ----------------------------------------------------------------- composition


class Overdrawn(Exception):
    """A user exception that crosses the handle boundary as itself."""


@tk.deployment(num_replicas=2)
class Counter:
    def __init__(self, start: int) -> None:
        self.start = start
        self.token = uuid.uuid4().hex[:6]

    async def add(self, x: int) -> int:
        return self.start + x

    def sync_double(self, x: int) -> int:
        return 2 * x

    async def withdraw(self, amount: int) -> int:
        raise Overdrawn(f"cannot withdraw {amount}")

    async def account(self, number: str) -> int:
        raise HTTPException(404, f"no account {number}")  # the caller's mistake

    async def who(self) -> str:
        return self.token


@tk.deployment
def shout(text: str) -> str:
    return text.upper() + "!"


front_api = FastAPI()


@tk.deployment
@tk.ingress(front_api)
class Front:
    def __init__(self, counter: tk.DeploymentHandle, shouter: tk.DeploymentHandle) -> None:
        self.counter = counter
        self.shouter = shouter

    @front_api.get("/add/{x}")
    async def add(self, x: int) -> dict[str, int]:
        return {"result": await self.counter.add.remote(x)}

    @front_api.get("/shout/{text}")
    async def shout(self, text: str) -> dict[str, str]:
        return {"result": await self.shouter.remote(text)}

    @front_api.get("/chain/{x}")
    async def chain(self, x: int) -> dict[str, int]:
        # A response passed as an argument is resolved before the second call.
        first = self.counter.add.remote(x)
        return {"result": await self.counter.sync_double.remote(first)}

    @front_api.get("/withdraw")
    async def withdraw(self) -> dict[str, str]:
        try:
            await self.counter.withdraw.remote(5)
        except Overdrawn as exc:
            return {"error": str(exc)}
        return {"error": ""}


def make_composed() -> tk.Application:
    return as_deployment(Front).bind(as_deployment(Counter).bind(100), shout.bind())


# ----------------------------------------------------------------- tk.Depends + user_config


@tk.deployment(user_config={"greeting": "hi"})
class Configured:
    def __init__(self) -> None:
        self.greeting = "unset"

    def reconfigure(self, config: dict[str, str]) -> None:
        self.greeting = config["greeting"]

    async def greet(self, name: str) -> str:
        return f"{self.greeting} {name}"


configured = as_deployment(Configured).bind()
depends_router = APIRouter()


@depends_router.get("/greet/{name}")
async def greet(name: str, greeter: tk.DeploymentHandle = tk.Depends(configured)) -> dict[str, str]:
    return {"message": await greeter.greet.remote(name)}


def make_depends_app() -> tk.App:
    return tk.App(depends_router)


# ----------------------------------------------------------------- plain __call__ ingress


# --8<-- [start:plain]
@tk.deployment
class Plain:
    async def __call__(self, request: Request) -> dict[str, str]:
        return {"path": request.url.path, "who": request.query_params.get("who", "")}


@tk.deployment
def plain_text(request: Request) -> str:
    return "plain " + request.query_params.get("who", "")


# --8<-- [end:plain]


# ----------------------------------------------------------------- batching


@tk.deployment(max_ongoing_requests=32, user_config={"max_batch_size": 8})
class BatchedSquare:
    def reconfigure(self, config: dict[str, int]) -> None:
        self.square.set_max_batch_size(config["max_batch_size"])

    @tk.batch(max_batch_size=4, batch_wait_timeout_s=0.05)
    async def square(self, xs: list[int]) -> list[Any]:
        return [ValueError(f"{x} is negative") if x < 0 else {"square": x * x, "batch": len(xs)} for x in xs]


# ----------------------------------------------------------------- streaming through handles


@tk.deployment
class Tokens:
    async def count(self, n: int, fail_at: int = -1) -> AsyncIterator[str]:
        for i in range(n):
            if i == fail_at:
                raise RuntimeError(f"failed at {i}")
            yield f"token-{i}"
            await asyncio.sleep(0.01)

    def sync_count(self, n: int) -> Any:
        for i in range(n):
            yield i * i

    async def forever(self, marker: str) -> AsyncIterator[int]:
        i = 0
        try:
            while True:
                yield i
                i += 1
                await asyncio.sleep(0.01)
        finally:
            Path(marker).touch()  # the generator was closed

    async def not_a_generator(self) -> int:
        return 1

    @tk.batch(max_batch_size=4, batch_wait_timeout_s=0.5)
    async def countdowns(self, starts: list[int]) -> AsyncIterator[list[Any]]:
        """A streaming batch: each caller counts down from its start, and learns how many
        callers shared the batch."""
        for step in range(max(starts) + 1):
            yield [f"{start - step}/{len(starts)}" if step <= start else StopIteration for start in starts]


tokens_api = FastAPI()


@tk.deployment
@tk.ingress(tokens_api)
class TokenFront:
    def __init__(self, tokens: tk.DeploymentHandle) -> None:
        self.tokens = tokens.options(stream=True)

    @tokens_api.get("/tokens/{n}")
    async def stream(self, n: int) -> Any:
        from fastapi.responses import StreamingResponse

        async def lines() -> AsyncIterator[str]:
            async for token in self.tokens.count.remote(n):
                yield token + "\n"

        return StreamingResponse(lines(), media_type="text/plain")

    @tokens_api.get("/countdown/{start}")
    async def countdown(self, start: int) -> Any:
        from fastapi.responses import StreamingResponse

        async def lines() -> AsyncIterator[str]:
            async for step in self.tokens.countdowns.remote(start):
                yield step + "\n"

        return StreamingResponse(lines(), media_type="text/plain")


def make_token_app() -> tk.Application:
    return as_deployment(TokenFront).bind(as_deployment(Tokens).bind())


# ----------------------------------------------------------------- WebSockets


ws_router = APIRouter()


@ws_router.websocket("/ws/echo")
async def ws_echo(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text == "close-4001":
                await websocket.close(code=4001, reason="asked to close")
                return
            if text is not None:
                await websocket.send_text(f"echo:{text}")
            else:
                await websocket.send_bytes(bytes(reversed(message["bytes"])))
    except WebSocketDisconnect:
        return


@ws_router.websocket("/ws/who")
async def ws_who(websocket: WebSocket) -> None:
    # Answers every message with this replica's token: shows the connection is pinned.
    await websocket.accept()
    try:
        while True:
            await websocket.receive_text()
            await websocket.send_text(websocket.state.replica_token)
    except WebSocketDisconnect:
        return


@ws_router.websocket("/ws/deny")
async def ws_deny(websocket: WebSocket) -> None:
    await websocket.close(code=1008)


def make_ws_app(**options: Any) -> tk.App:
    app = FastAPI(lifespan=lifespan)
    app.include_router(ws_router)
    return tk.App(app, **options)


def make_catch_all_ws_app(**options: Any) -> tk.App:
    """A WebSocket at every path, which sends its path and closes."""
    app = FastAPI()

    @app.websocket("/{anything:path}")
    async def anywhere(websocket: WebSocket, anything: str) -> None:
        await websocket.accept()
        await websocket.send_text("/" + anything)
        await websocket.close()

    return tk.App(app, **options)


def make_ticker_app(outcome: Path, **options: Any) -> tk.App:
    """A WebSocket that sends 50 ticks, 20 ms apart, then waits for the client to close,
    and writes what its receive() heard to ``outcome`` (or the name of what its send raised)."""
    app = FastAPI()

    @app.websocket("/ticks")
    async def ticks(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            for _ in range(50):
                await websocket.send_text("tick")
                await asyncio.sleep(0.02)
        except Exception as failed:
            outcome.write_text(type(failed).__name__)
            raise
        outcome.write_text((await websocket.receive())["type"])

    return tk.App(app, **options)


# ----------------------------------------------------------------- versions (upgrades)


def make_versioned_app(version: str, **options: Any) -> tk.App:
    """An app whose code differs per ``version`` (the route closes over it)."""
    router = APIRouter()

    @router.get("/version")
    async def report(seconds: float = 0.0) -> dict[str, str]:
        await asyncio.sleep(seconds)
        return {"version": version, "replica": tk.get_replica_context().replica_id}

    @router.get("/version/slow")
    async def slow(seconds: float) -> StreamingResponse:
        """First line at once (the request is running), the version after ``seconds``."""

        async def lines() -> AsyncIterator[bytes]:
            yield b"started\n"
            await asyncio.sleep(seconds)
            yield version.encode()

        return StreamingResponse(lines())

    return tk.App(router, **options)


def make_broken_version(**options: Any) -> tk.App:
    """Serves /version like make_versioned_app, but every request fails (a bad canary)."""
    router = APIRouter()

    @router.get("/version")
    async def report() -> dict[str, str]:
        raise RuntimeError("this build is broken")

    return tk.App(router, **options)


#: How long make_slow_flaky_version takes per request.
SLOW_VERSION_S = 1.0


def make_slow_flaky_version(**options: Any) -> tk.App:
    """Serves /version after SLOW_VERSION_S, failing every other request (a bad shadow)."""
    router = APIRouter()
    served = itertools.count()

    @router.get("/version")
    async def report() -> dict[str, str]:
        await asyncio.sleep(SLOW_VERSION_S)
        if next(served) % 2:
            raise RuntimeError("the shadow fails half its requests")
        return {"version": "shadow"}

    return tk.App(router, **options)


# ----------------------------------------------------------------- health checks


# --8<-- [start:health]
@tk.deployment(health_check_period_s=0.2, health_check_failure_threshold=2)
class Guarded:
    def __init__(self) -> None:
        self.sick = False

    def check_health(self) -> None:  # raise to report the replica unhealthy
        if self.sick:
            raise RuntimeError("lost the model")

    def fall_ill(self) -> str:
        self.sick = True
        return tk.get_replica_context().replica_id


# --8<-- [end:health]


@tk.deployment
class Unsendable:
    """Returns (and yields) values that cannot be pickled to the caller."""

    def frame(self) -> object:
        import sys

        return sys._getframe()  # a stack frame cannot be pickled

    async def items(self) -> object:
        yield 1
        yield (x for x in range(3))  # a generator object cannot be pickled

    def stranger(self) -> object:
        return _ReplicaOnly()


def _load_in(pid: int) -> object:
    if os.getpid() != pid:  # as when the caller lacks the module the class lives in
        raise ImportError("No module named 'replica_only'")
    return object()


class _ReplicaOnly:
    """Pickles fine, but loads only in the process that made it."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (_load_in, (os.getpid(),))


@tk.deployment
class Threads:
    """Reports the OpenMP thread count its replica process was given."""

    def omp(self) -> str | None:
        import os

        return os.environ.get("OMP_NUM_THREADS")


# ----------------------------------------------------------------- multiplexing


# --8<-- [start:multiplexed]
@tk.deployment(num_replicas=3, max_ongoing_requests=16)
class Models:
    """Six models over three replicas holding two each (Ray Serve's multiplexing API)."""

    def __init__(self) -> None:
        self.loads: dict[str, int] = {}

    @tk.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str) -> dict[str, str]:
        if model_id.startswith("bad"):
            raise ValueError(f"there is no model {model_id}")
        self.loads[model_id] = self.loads.get(model_id, 0) + 1
        await asyncio.sleep(0.05)  # loading takes a while: concurrent requests share it
        return {"id": model_id}

    async def infer(self) -> dict[str, Any]:
        model = await self.get_model(tk.get_multiplexed_model_id())
        replica = tk.get_replica_context().replica_id
        return {"model": model["id"], "replica": replica, "loads": dict(self.loads)}

    async def __call__(self, request: Request) -> dict[str, Any]:
        return await self.infer()


# --8<-- [end:multiplexed]
