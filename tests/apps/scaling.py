"""An autoscaled deployment with short timers, for the autoscaling tests and benchmark."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

import app_toolkit as tk

router = APIRouter()


@router.get("/work")
async def work(seconds: float = 0.2) -> dict[str, Any]:
    await asyncio.sleep(seconds)
    return {"replica": tk.get_replica_context().replica_id}


# --8<-- [start:autoscaling]
FAST_SCALING = {
    "min_replicas": 0,
    "max_replicas": 3,
    "target_ongoing_requests": 2,
    "upscale_delay_s": 0.5,
    "downscale_delay_s": 2,
    "downscale_to_zero_delay_s": 2,
    "look_back_period_s": 1,
}


def make_app(**scaling: Any) -> tk.App:
    return tk.App(router, name="scaling", autoscaling_config={**FAST_SCALING, **scaling})


# --8<-- [end:autoscaling]
