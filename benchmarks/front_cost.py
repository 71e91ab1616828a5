"""What the direct path adds to a request, measured in one process without Ray.

The bench app's ingress runs in a replica core, as in an ingress replica; each request
(GET ``/small``, the scope our HTTP server would make) is driven straight into:

- ``bare``: the FastAPI app alone (what bare uvicorn runs);
- ``replica``: the replica's part only (``ReplicaCore.serve_app``: request context,
  span, its two metric series) around the app;
- ``direct``: the whole direct path (the front, ``HTTPFront`` with the replica as its local
  ingress, then the replica): what a request on a replica-owned connection runs;
- ``direct-keys``: ``direct`` with 100 API keys in the options and the request presenting
  one (``Authorization: Bearer``): what the key check adds;
- ``floor``: the least a front with the toolkit's per-request features could do (a request
  id in and out, a trace, two metric series, an access line) around the replica's part;
- ``wire-bare``, ``wire-direct``: ``bare`` and ``direct`` with the HTTP protocol around
  them, from the request's bytes to the response's (``front_wire.py``): uvicorn's for
  bare uvicorn, ours on a connection the proxy handed over for the direct path.

``--without`` drops features from every mode (``trace``, ``scope``, ``metrics``,
``access-log``) to see what each costs. Logs as a replica does (access lines formatted
in batches), to /dev/null. Prints the thread's CPU time per request, the median and the
minimum of ``--rounds`` rounds (docs/benchmarks.md quotes them).

    python -m benchmarks.front_cost [--modes bare,direct,wire-bare,wire-direct] [--without trace,metrics]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import pickle
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app_toolkit import metrics
from app_toolkit._runtime import log_format, request_context, tracing
from app_toolkit._runtime.direct_ingress.replica_upstream import ReplicaUpstream
from app_toolkit._runtime.front.access_log import AccessLog
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit._runtime.front.request_link import REQUEST_LINK, ConnectionLink, Writes
from app_toolkit._runtime.front.request_metrics import HTTP_DURATION
from app_toolkit._runtime.messages import DeploymentID, HTTPResponse, RouteInfo
from app_toolkit._runtime.replica.replica import ReplicaCore
from app_toolkit._runtime.tables import ApplicationTable
from app_toolkit.build import build_app
from app_toolkit.config import HTTPOptions
from app_toolkit.config.api_keys import APIKey, key_hash, new_key
from benchmarks import bench_app, front_wire

MODES = ("bare", "replica", "direct", "direct-keys", "floor", *front_wire.MODES)


@functools.cache
def _keyed() -> tuple[HTTPOptions, tuple[bytes, bytes]]:
    """``direct-keys``: the front's options with 100 keys, and the header each request
    presents one of them in."""
    keys = [new_key() for _ in range(100)]
    options = HTTPOptions(api_keys=tuple(APIKey(name=f"k{i}", hash=key_hash(k)) for i, k in enumerate(keys)))
    return options, (b"authorization", f"Bearer {keys[50]}".encode())


FEATURES = ("trace", "scope", "metrics", "access-log")
_REQUEST_ID = "0123456789abcdef0123456789abcdef"


class _NoPolicy:
    has_policy = False

    def serving_here(self, replica_id: str, count: Callable[[], int]) -> Callable[[], None]:
        return _nothing


def _nothing() -> None:
    pass


class _OneRoute:
    """The proxy's table subscriber, with the bench app at ``/`` and nothing else."""

    #: No controller: keys' limits (none here) would be kept by the front on its own.
    take_quota = None

    def __init__(self, deployment: DeploymentID) -> None:
        self._table = ApplicationTable((RouteInfo("/", "bench", deployment),))

    def watch(self, key: str, apply: Callable[[object], None]) -> asyncio.Event:
        apply(self._table)
        return asyncio.Event()

    def dispatcher(self, deployment: DeploymentID) -> _NoPolicy:
        return _NoPolicy()


class _NoTransport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def _drop(features: set[str]) -> None:
    """Make the dropped features cost nothing (this process only)."""
    if "metrics" in features:
        metrics.Counter.inc = lambda self, *labels, amount=1.0: None  # type: ignore[method-assign]
        metrics.Histogram.observe = lambda self, value, *labels: None  # type: ignore[method-assign]
    if "trace" in features:
        fixed = tracing.TraceContext("0" * 31 + "1", "0" * 15 + "1", "")
        tracing.new_trace = lambda: fixed
        tracing.child = lambda parent: fixed
    if "scope" in features:
        request_context.request_scope = lambda *args, **kwargs: contextlib.nullcontext()


async def _replica() -> tuple[ReplicaCore, DeploymentID]:
    objects: dict[bytes, object] = {}

    def keep(value: object) -> bytes:
        key = str(len(objects)).encode()
        objects[key] = value
        return key

    spec = build_app(bench_app.app, "bench", "/", keep)
    ingress = next(d for d in spec.deployments if d.id.name == spec.ingress)
    definition, init_args = objects[ingress.definition], objects[ingress.init_args]
    core = ReplicaCore("r1", ingress.id, ingress.config, definition, init_args, pickle.dumps)  # type: ignore[arg-type]
    await core.start()
    core.enter_serving()
    return core, ingress.id


class _PassOut:
    """The app's messages straight to ``send`` (a ``run_app.HTTPOut`` that adds nothing)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.head_seen = False
        self.complete = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.head_seen = True
        elif not message.get("more_body", False):
            self.complete = True
        await self._send(message)

    def end(self) -> None:
        pass

    def refused(self) -> bool:
        return False

    async def answer(self, response: HTTPResponse) -> None:
        raise AssertionError(f"the bench app failed: {response.status}")

    async def cut_off(self, why: str) -> None:
        raise AssertionError(f"the bench app failed: {why}")


def _floor(core: ReplicaCore, log: AccessLog | None) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        request_id = f"{random.getrandbits(128):032x}"
        scope["headers"].append((b"x-request-id", request_id.encode()))
        status = 500

        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", request_id.encode())]
            await send(message)

        async with core.slot():  # the trace starts here (None)
            await core.serve_app(request_id, scope, receive, _PassOut(answer), None, started)
        took = time.perf_counter() - started
        HTTP_DURATION.observe(took, "bench", "/small", scope["method"], str(status))  # and the request count
        if log is not None:
            log.add(scope, status, took, request_id, "bench", "/small")

    return app


async def _app(mode: str, core: ReplicaCore, deployment: DeploymentID, access_log: bool) -> ASGIApp:
    if mode in ("direct", "direct-keys"):
        subscriber = _OneRoute(deployment)
        local = ReplicaUpstream(core, subscriber)  # type: ignore[arg-type]
        http = _keyed()[0] if mode == "direct-keys" else HTTPOptions()
        http = http.model_copy(update={"access_log": access_log})
        return HTTPFront(subscriber, http, local=local)  # type: ignore[arg-type]
    if mode == "floor":
        return _floor(core, AccessLog() if access_log else None)
    trace = tracing.new_trace()

    async def replica_only(scope: Scope, receive: Receive, send: Send) -> None:
        async with core.slot():
            await core.serve_app(_REQUEST_ID, scope, receive, _PassOut(send), trace, time.perf_counter())

    return replica_only


async def _measure(mode: str, access_log: bool, requests: int, rounds: int) -> list[float]:
    if mode == "bare":  # no replica at all
        return await _rounds(bench_app.make_fastapi(), requests, rounds)
    if mode == "wire-bare":
        return await front_wire.rounds(mode, bench_app.make_fastapi(), requests, rounds, _timed)
    core, deployment = await _replica()
    try:
        if mode == "wire-direct":
            app = await _app("direct", core, deployment, access_log)
            return await front_wire.rounds(mode, app, requests, rounds, _timed)
        extra = [_keyed()[1]] if mode == "direct-keys" else []
        return await _rounds(await _app(mode, core, deployment, access_log), requests, rounds, extra)
    finally:
        await core.drain()


async def _rounds(
    app: ASGIApp, requests: int, rounds: int, extra: list[tuple[bytes, bytes]] | None = None
) -> list[float]:
    writes = Writes(_NoTransport())  # type: ignore[arg-type]

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        pass

    async def one() -> None:
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 50000),
            "scheme": "http",
            "method": "GET",
            "root_path": "",
            "path": "/small",
            "raw_path": b"/small",
            "query_string": b"",
            "headers": [
                (b"host", b"127.0.0.1:8000"),
                (b"user-agent", b"wrk"),
                (b"accept", b"*/*"),
                *(extra or ()),
            ],
            "state": {},
            REQUEST_LINK: ConnectionLink(writes),
        }
        await app(scope, receive, send)

    return await _timed(one, requests, rounds)


async def _timed(one: Callable[[], Awaitable[None]], requests: int, rounds: int) -> list[float]:
    """Run ``one`` request ``requests`` times per round (after half as many to warm up);
    the thread's CPU time per request of each round, in microseconds."""

    async def run(count: int) -> None:
        for done in range(count):
            await one()
            if done % 100 == 99:
                await asyncio.sleep(0)  # what a server's loop does between reads: due callbacks run

    await run(requests // 2)  # warm up
    per_request = []
    for _ in range(rounds):
        started = time.thread_time()
        await run(requests)
        per_request.append(1e6 * (time.thread_time() - started) / requests)
    return per_request


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--without", default="", help=f"features to drop: {', '.join(FEATURES)}")
    parser.add_argument("--requests", type=int, default=5000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    modes = [mode for mode in args.modes.split(",") if mode]
    dropped = {feature for feature in args.without.split(",") if feature}
    unknown = [mode for mode in modes if mode not in MODES] + sorted(dropped - set(FEATURES))
    if unknown:
        parser.error(f"unknown mode or feature: {', '.join(unknown)}")
    _drop(dropped)
    # Logged as a replica logs (the access lines are formatted and written in batches),
    # to nowhere: only the figures are printed.
    sys.stderr = open(os.devnull, "w")  # for the life of the process
    log_format.configure()
    label = f" without {', '.join(sorted(dropped))}" if dropped else ""
    for mode in modes:
        figures = uvloop.run(_measure(mode, "access-log" not in dropped, args.requests, args.rounds))
        print(
            f"{mode + label:40s} {statistics.median(figures):6.1f} us per request "
            f"(min {min(figures):.1f}, {args.rounds} rounds of {args.requests})",
            flush=True,
        )


if __name__ == "__main__":
    main()
