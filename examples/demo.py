"""The quick-start demo: an ordinary FastAPI router served by app_toolkit.

Run it with ``make run`` (or ``app-toolkit run examples.demo:app``), then::

    curl http://127.0.0.1:8000/hello/world
    curl -X POST http://127.0.0.1:8000/notes -H 'content-type: application/json' \
         -d '{"text": "hello"}'
    open http://127.0.0.1:8000/docs
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel

import app_toolkit as tk


# --8<-- [start:deployment]
@tk.deployment(num_replicas=1, max_ongoing_requests=32)
class Greeter:
    """A stateful deployment: built once per replica, called through a handle."""

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting
        self.calls = 0

    async def greet(self, name: str) -> str:
        self.calls += 1
        return f"{self.greeting}, {name}!"


# --8<-- [end:deployment]


# --8<-- [start:app]
class Note(BaseModel):
    text: str


router = APIRouter()
_notes: list[str] = []  # per replica: demo state only


# --8<-- [start:depends]
#: Bound once; every route that depends on it shares the one Greeter deployment.
greeter = Greeter.bind("Hello")


@router.get("/hello/{name}")
async def hello(name: str, greeter: tk.DeploymentHandle = tk.Depends(greeter)) -> dict[str, str]:
    return {"message": await greeter.greet.remote(name)}


# --8<-- [end:depends]


@router.post("/notes", status_code=201)
async def add_note(note: Note) -> dict[str, int]:
    if not note.text.strip():
        raise HTTPException(status_code=400, detail="text must not be blank")
    _notes.append(note.text)
    return {"count": len(_notes)}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


#: The application: the router in 2 ingress replicas; Greeter joins through tk.Depends.
app = tk.App(router, name="demo", num_replicas=2)
# --8<-- [end:app]
