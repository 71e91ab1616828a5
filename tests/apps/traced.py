"""Three hops for trace propagation: the ingress calls Middle, which calls Last."""

from __future__ import annotations

from fastapi import APIRouter

import app_toolkit as tk
from app_toolkit.tracing import current_trace
from tests.deployments import as_deployment


def _span() -> dict[str, str]:
    trace = current_trace()
    assert trace is not None
    return {"trace": trace.trace_id, "span": trace.span_id, "parent": trace.parent_id, "state": trace.state}


@tk.deployment
class Last:
    def span(self) -> dict[str, str]:
        return _span()


@tk.deployment
class Middle:
    def __init__(self, last: tk.DeploymentHandle) -> None:
        self.last = last

    async def chain(self) -> list[dict[str, str]]:
        return [_span(), await self.last.span.remote()]


chain = as_deployment(Middle).bind(as_deployment(Last).bind())
router = APIRouter()


@router.get("/spans")
async def spans(middle: tk.DeploymentHandle = tk.Depends(chain)) -> list[dict[str, str]]:
    return [_span(), *(await middle.chain.remote())]


def make_app() -> tk.App:
    return tk.App(router)
