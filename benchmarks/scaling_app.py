"""Route code for the autoscaling benchmark: an I/O-bound endpoint, scaled from zero."""

from __future__ import annotations

import asyncio
import os
import time

from fastapi import APIRouter

import app_toolkit as tk

#: Seconds this module's import takes, standing in for a large library
#: (``benchmarks.autoscaling --import-s``: the replicas' processes inherit it).
IMPORT_S_ENV = "APP_TOOLKIT_BENCH_IMPORT_S"
time.sleep(float(os.environ.get(IMPORT_S_ENV) or 0))

router = APIRouter()


@router.get("/work")
async def work(seconds: float = 0.1) -> dict[str, str]:
    await asyncio.sleep(seconds)
    return {"replica": tk.get_replica_context().replica_id}


SCALING = {
    "min_replicas": 0,
    "max_replicas": 4,
    "target_ongoing_requests": 4,
    "upscale_delay_s": 1,
    "downscale_delay_s": 5,
    "downscale_to_zero_delay_s": 5,
    "look_back_period_s": 2,
}

app = tk.App(router, name="scalebench", autoscaling_config=SCALING, max_ongoing_requests=8)
