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


# Every deployment option set in code, away from its default (between the two deployments:
# num_replicas and autoscaling_config, max_replicas_per_node and placement groups exclude
# each other): app-toolkit build must write each and the file must load it back.
@tk.deployment(
    num_replicas=2,
    max_ongoing_requests=7,
    max_queued_requests=9,
    backpressure_config={"status_code": 429, "retry_after_s": 3},
    affinity="prefer",
    user_config={"threshold": [1, 2]},
    health_check_period_s=4,
    health_check_timeout_s=5,
    health_check_failure_threshold=2,
    graceful_shutdown_wait_loop_s=1,
    graceful_shutdown_timeout_s=6,
    ray_actor_options={"num_cpus": 0.5, "memory": 2**20, "resources": {"accel": 1}},
    rolling_update_percentage=0.5,
    max_surge_percent=10,
    surge_timeout_s=12,
    continuation_wait_s=90,
    max_replicas_per_node=1,
    logging_config={"encoding": "JSON", "log_level": "WARNING", "enable_access_log": False},
)
class EveryOption:
    def __init__(self, scaled: tk.DeploymentHandle) -> None:
        self.scaled = scaled


@tk.deployment(
    autoscaling_config={
        "min_replicas": 0,
        "max_replicas": 4,
        "initial_replicas": 1,
        "target_ongoing_requests": 3,
        "upscale_delay_s": 1,
        "downscale_delay_s": 2,
        "downscale_to_zero_delay_s": 5,
        "look_back_period_s": 4,
        "upscaling_factor": 1.5,
        "downscaling_factor": 0.5,
    },
    placement_group_bundles=[{"CPU": 0.1}, {"CPU": 1}],
    placement_group_strategy="SPREAD",
    direct_ingress=False,
    request_router_config={
        "request_router_class": "app_toolkit.request_router.prefix_aware:PrefixCacheAffinityRouter",
        "request_router_kwargs": {"imbalanced_threshold": 3},
    },
)
class Scaled:
    pass


every_option = as_deployment(EveryOption).bind(as_deployment(Scaled).bind())
