"""Applications deployed from config files (tests/integration/test_config_deploy.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI
from pydantic import BaseModel

import app_toolkit as tk
from tests.deployments import as_deployment


class GreetArgs(BaseModel):
    greeting: str = "Hello"
    fail: bool = False


@tk.deployment(user_config={"punctuation": "!"}, num_replicas=1)
class Greeter:
    def __init__(self, greeting: str, fail: bool) -> None:
        if fail:
            raise RuntimeError("the greeter was told to fail")
        self.greeting = greeting
        self.punctuation = ""

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.punctuation = config["punctuation"]

    def greet(self, who: str) -> dict[str, str]:
        replica = tk.get_replica_context().replica_id
        return {"text": f"{self.greeting}, {who}{self.punctuation}", "replica": replica}


front = FastAPI()


@tk.deployment
@tk.ingress(front)
class Front:
    def __init__(self, greeter: tk.DeploymentHandle) -> None:
        self.greeter = greeter

    @front.get("/greet/{who}")
    async def greet(self, who: str) -> dict[str, str]:
        answer: dict[str, str] = await self.greeter.greet.remote(who)
        return answer


def build(args: GreetArgs) -> tk.Application:
    """An application builder: import_path names it, the file's args configure it."""
    return as_deployment(Front).bind(as_deployment(Greeter).bind(args.greeting, args.fail))


hello_router = APIRouter()


@hello_router.get("/hello")
def say_hello() -> str:
    return "hello"


hello = tk.App(hello_router, name="hello")


def _which(answer: str) -> tk.App:
    router = APIRouter()

    @router.get("/which")
    def which() -> str:
        return answer

    return tk.App(router)


#: Two versions of one app, for traffic splits in a config file.
blue = _which("blue")
green = _which("green")
