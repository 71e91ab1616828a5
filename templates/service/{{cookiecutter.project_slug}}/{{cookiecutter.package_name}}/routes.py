"""The HTTP routes: an ordinary FastAPI router."""

from __future__ import annotations

import app_toolkit as tk
from fastapi import APIRouter
from pydantic import BaseModel, Field


class Greeting(BaseModel):
    message: str


class Name(BaseModel):
    name: str = Field(min_length=1, max_length=100)


def build_router(greeter: tk.Application) -> APIRouter:
    router = APIRouter()

    @router.get("/hello/{name}")
    async def hello(name: str, handle: tk.DeploymentHandle = tk.Depends(greeter)) -> Greeting:
        return Greeting(message=await handle.greet.remote(name))

    @router.post("/greetings", status_code=201)
    async def greet(body: Name, handle: tk.DeploymentHandle = tk.Depends(greeter)) -> Greeting:
        return Greeting(message=await handle.greet.remote(body.name))

    return router
