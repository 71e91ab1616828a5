"""OpenTelemetry spans through the whole path: proxy → ingress → handle call → Middle →
handle call → Last, plus a span the user's code makes inside Last.

Runs in a fresh process (``test_otel.py``) with ``APP_TOOLKIT_OTEL_SETUP`` naming
``tests.apps.otel_setup:setup``, so every toolkit process it starts (the Ray workers
inherit the environment) exports its spans to one JSON-lines file. Prints one JSON line:
what each hop's ``current_trace()`` said, and the spans exported.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import httpx
from fastapi import APIRouter, Request
from opentelemetry import trace

import app_toolkit as tk
from app_toolkit.tracing import current_trace
from tests.apps.otel_setup import SPANS_FILE_ENV
from tests.apps.ray_only import holds_connection_from
from tests.conftest import free_port
from tests.deployments import as_deployment
from tests.waiting import wait_for

CLIENT_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _seen() -> dict[str, str]:
    context = current_trace()
    assert context is not None
    return {"trace": context.trace_id, "span": context.span_id, "parent": context.parent_id}


@tk.deployment
class Last:
    def span(self) -> dict[str, str]:
        with trace.get_tracer("user-code").start_as_current_span("user work"):
            return _seen()

    def fail(self) -> None:
        raise ValueError("no")


@tk.deployment
class Middle:
    def __init__(self, last: tk.DeploymentHandle) -> None:
        self.last = last

    async def chain(self) -> list[dict[str, str]]:
        return [_seen(), await self.last.span.remote()]


last = as_deployment(Last).bind()
chain = as_deployment(Middle).bind(last)
router = APIRouter()


@router.get("/spans")
async def spans(middle: tk.DeploymentHandle = tk.Depends(chain)) -> list[dict[str, str]]:
    return [_seen(), *(await middle.chain.remote())]


@router.get("/owner")
async def owner(request: Request) -> bool:
    """Whether this replica's process holds the client's connection (direct ingress)."""
    assert request.client is not None
    return holds_connection_from(request.client.port)


@router.get("/fail")
async def fail(failing: tk.DeploymentHandle = tk.Depends(last)) -> None:
    await failing.fail.remote()


def _owned(port: int) -> bool:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:  # a fresh connection
        return bool(client.get("/otel/owner").json())


def _exported(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as lines:
        return [json.loads(line) for line in lines]


def main(backend: str) -> None:
    path = os.environ[SPANS_FILE_ENV]
    port = free_port()
    tk.start(http_options={"port": port}, backend=backend)
    try:
        tk.run(tk.App(router), name="otel", route_prefix="/otel")
        if backend == "ray":  # the proxy hands connections over a moment after run() returns
            wait_for(lambda: _owned(port), 30, "a connection handed to the ingress replica")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            seen = client.get("/otel/spans", headers={"traceparent": CLIENT_TRACEPARENT}).json()
            failed = client.get("/otel/fail").status_code
        # 7 spans for /spans, 4 for /fail; the last ones end just after the responses.
        wait_for(lambda: len(_exported(path)) >= 11, 20, "every span to be exported")
    finally:
        tk.shutdown()
    print(json.dumps({"seen": seen, "failed": failed, "exported": _exported(path)}))


if __name__ == "__main__":
    main(sys.argv[1])
