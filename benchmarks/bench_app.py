"""The route code both servers run in the benchmarks (same code, same FastAPI app)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, FastAPI, Request

import app_toolkit as tk

router = APIRouter()


@router.get("/small")
async def small() -> dict[str, str]:
    return {"hello": "world"}


@router.post("/echo")
async def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


@router.get("/sleep")
async def sleep() -> dict[str, bool]:
    await asyncio.sleep(0.01)
    return {"slept": True}


@router.post("/upload")
async def upload(request: Request) -> dict[str, int]:
    return {"size": len(await request.body())}


def make_fastapi() -> FastAPI:
    app = FastAPI()
    app.include_router(router)
    return app


#: Bare uvicorn serves this: ``uvicorn benchmarks.bench_app:fastapi_app``.
fastapi_app = make_fastapi()

#: The toolkit serves the same router: ``app-toolkit run benchmarks.bench_app:app``.
app = tk.App(make_fastapi(), name="bench", max_ongoing_requests=256, max_queued_requests=4096)

#: Two ingress replicas (``benchmarks.bench_app:app2``).
app2 = tk.App(
    make_fastapi(), name="bench", num_replicas=2, max_ongoing_requests=256, max_queued_requests=4096
)

#: The same on the proxied path (``http_overhead --proxied``): the proxy serves every
#: connection and forwards each request to the replica.
app_proxied = tk.App(
    make_fastapi(), name="bench", max_ongoing_requests=256, max_queued_requests=4096, direct_ingress=False
)
app2_proxied = tk.App(
    make_fastapi(),
    name="bench",
    num_replicas=2,
    max_ongoing_requests=256,
    max_queued_requests=4096,
    direct_ingress=False,
)

#: A shadow for ``http_overhead --shadow``: each request takes 1 s and every other fails.
shadow_router = APIRouter()
_shadow_served = [0]


@shadow_router.get("/small")
async def slow_flaky_small() -> dict[str, str]:
    await asyncio.sleep(1.0)
    _shadow_served[0] += 1
    if _shadow_served[0] % 2:
        raise RuntimeError("the shadow fails half its requests")
    return {"hello": "shadow"}


shadow = tk.App(shadow_router, name="bench-shadow", max_ongoing_requests=256)
