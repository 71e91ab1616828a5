"""The benchmark app as a production FastAPI service serves it: the same routes, plus what
such a service adds per request (docs/benchmarks.md, "Baselines"): a request id read or
made for every request and sent back (``asgi-correlation-id``), Prometheus metrics per
route at ``/metrics`` (``prometheus-fastapi-instrumentator``), and uvicorn's own access log
(``http_overhead`` starts it with the log on). The same per-request work as the toolkit's
defaults: request id, metrics per route, access line.

    uvicorn benchmarks.production_app:app

Needs the ``bench`` extra (``make bench`` installs it).
"""

from __future__ import annotations

from asgi_correlation_id import CorrelationIdMiddleware
from fastapi import FastAPI
from prometheus_fastapi_instrumentator import Instrumentator

from benchmarks.bench_app import make_fastapi


def make_production() -> FastAPI:
    served = make_fastapi()
    served.add_middleware(CorrelationIdMiddleware, header_name="X-Request-ID")
    Instrumentator().instrument(served).expose(served, endpoint="/metrics")
    return served


app = make_production()
