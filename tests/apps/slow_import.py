"""An autoscaled deployment whose module takes long to import (as one importing a large
library would): a spare replica process should have loaded it before it is needed."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

import app_toolkit as tk
from tests.apps.scaling import FAST_SCALING

IMPORT_S = 2.0
time.sleep(IMPORT_S)  # stands in for heavy imports (a model library, a client SDK)

router = APIRouter()


@router.get("/work")
async def work() -> dict[str, Any]:
    return {"replica": tk.get_replica_context().replica_id}


def make_app() -> tk.App:
    return tk.App(router, name="slow_import", autoscaling_config=FAST_SCALING)
