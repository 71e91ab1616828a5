"""An app whose code can block its replica's event loop, for the hung-replica tests."""

from __future__ import annotations

import os
import time
from typing import Any

from fastapi import APIRouter

import app_toolkit as tk

router = APIRouter()


@router.get("/pid")
async def pid() -> int:
    return os.getpid()


@router.get("/block")
async def block() -> None:
    time.sleep(3600)  # the mistake: a blocking call in an async route stops the whole loop


def make_app(**options: Any) -> tk.App:
    fast_checks = {
        "health_check_period_s": 0.5,
        "health_check_timeout_s": 1,
        "health_check_failure_threshold": 2,
    }
    return tk.App(router, **{**fast_checks, **options})
