"""An app whose start-up waits at a gate, for the tests that stop ``app-toolkit run`` while
it starts: its module's import (before Ray starts: the command imports the app first) or
its model's constructor (during the deploy, as a model loading would).

``GATE_DIR_ENV`` names a folder; ``GATE_STAGE_ENV`` the stage that waits ("import" or
"constructor"; unset: none). At that stage the app writes ``<stage>.reached`` in the
folder, then waits until a file named ``open`` appears there (a bounded wait: a process
the test leaves behind does not wait forever).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fastapi import APIRouter

import app_toolkit as tk
from tests.deployments import as_deployment

GATE_DIR_ENV = "APP_TOOLKIT_TEST_GATE_DIR"
GATE_STAGE_ENV = "APP_TOOLKIT_TEST_GATE_STAGE"
_GATE_WAIT_S = 120.0


def wait_at_gate(stage: str) -> None:
    """At ``stage``, if it is the gated one: say so, then wait for the gate to open."""
    if os.environ.get(GATE_STAGE_ENV) != stage:
        return
    folder = Path(os.environ[GATE_DIR_ENV])
    (folder / f"{stage}.reached").touch()
    deadline = time.monotonic() + _GATE_WAIT_S
    while not (folder / "open").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the situation under test: a start-up that takes long


wait_at_gate("import")  # stands in for a slow import (a model library)


@tk.deployment
class Model:
    def __init__(self) -> None:
        wait_at_gate("constructor")  # stands in for loading a model

    async def predict(self, text: str) -> str:
        return text.upper()


model = as_deployment(Model).bind()
router = APIRouter()


@router.get("/predict/{text}")
async def predict(text: str, model: tk.DeploymentHandle = tk.Depends(model)) -> dict[str, str]:
    return {"text": await model.predict.remote(text)}


#: Two ingress replicas: the first answers while the second still starts, so the app is
#: not yet running then (the moment the first-answer test sends its signal in).
app = tk.App(router, name="gated", num_replicas=2)
