"""OpenTelemetry spans on both backends (each in a process of its own, since a tracer
provider is set once per process): the proxy, every replica and every handle call export
a span, each the child of the hop before, with the ids ``current_trace()`` reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app_toolkit._runtime import tracing
from app_toolkit.tracing import TraceContext
from tests.apps.otel_setup import SPANS_FILE_ENV
from tests.integration.otel_scenario import CLIENT_TRACEPARENT
from tests.scenario import run_scenario

TRACE, CLIENT_SPAN = CLIENT_TRACEPARENT.split("-")[1:3]


def _ancestors(by_id: dict[str, dict[str, Any]], span: dict[str, Any]) -> list[str]:
    found = []
    while span["parent"] in by_id:
        found.append(span["parent"])
        span = by_id[span["parent"]]
    return found


def _one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [span for span in spans if span["name"] == name]
    assert len(found) == 1, (name, [span["name"] for span in spans])
    return found[0]


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_spans_for_the_proxy_each_replica_and_each_handle_call(backend: str, tmp_path: Path) -> None:
    result = run_scenario(
        "tests.integration.otel_scenario",
        backend,
        timeout_s=180,
        env_extra={tracing.SETUP_ENV: "tests.apps.otel_setup:setup", SPANS_FILE_ENV: str(tmp_path / "spans")},
    )
    spans = [span for span in result["exported"] if span["trace"] == TRACE]
    by_id = {span["span"]: span for span in spans}
    proxy = next(span for span in spans if span["parent"] == CLIENT_SPAN)
    ingress = next(span for span in spans if span["kind"] == "SERVER" and span["parent"] == proxy["span"])
    to_middle = _one(spans, "call Middle.chain")
    middle = _one(spans, "otel/Middle.chain")
    to_last = _one(spans, "call Last.span")
    last = _one(spans, "otel/Last.span")
    user = _one(spans, "user work")
    # Each hop is the child of the one before, from the client's span down to user code.
    assert (proxy["name"], proxy["kind"]) == ("GET /otel/spans", "SERVER")
    assert proxy["attributes"]["http.route"] == "/otel/spans"
    assert proxy["attributes"]["http.response.status_code"] == 200
    assert ingress["name"] == "otel/Ingress GET /spans"
    # FastAPI's own spans nest inside the ingress's; the handle call inside its endpoint.
    assert ingress["span"] in _ancestors(by_id, to_middle) and to_middle["kind"] == "CLIENT"
    fastapi_spans = [span for span in spans if span["name"].startswith("fastapi.")]
    assert fastapi_spans and all(ingress["span"] in _ancestors(by_id, span) for span in fastapi_spans)
    assert (middle["kind"], middle["parent"]) == ("SERVER", to_middle["span"])
    assert to_last["parent"] == middle["span"] and last["parent"] == to_last["span"]
    assert user["parent"] == last["span"]
    assert not any(span["error"] for span in spans)
    # current_trace() in each replica names the span exported for it.
    seen = result["seen"]
    assert [s["span"] for s in seen] == [ingress["span"], middle["span"], last["span"]]
    assert [s["parent"] for s in seen] == [proxy["span"], to_middle["span"], to_last["span"]]
    assert {s["trace"] for s in seen} == {TRACE}
    if backend == "ray":
        # Direct ingress: the ingress replica's process owns the connection, so the HTTP
        # span and the ingress's are made there; Middle and Last each in a process of its own.
        assert proxy["pid"] == ingress["pid"]
        assert len({span["pid"] for span in (ingress, middle, last)}) == 3

    # A failing call marks its spans as errors, up to the proxy's 500.
    assert result["failed"] == 500
    failing = [span for span in result["exported"] if span["trace"] != TRACE]
    errors = {span["name"] for span in failing if span["error"]}
    assert errors >= {"GET /otel/fail", "call Last.fail", "otel/Last.fail"}


def test_without_a_tracer_provider_no_span_is_made() -> None:
    # This test process never sets one: the toolkit's ids are its own, nothing else is made.
    assert tracing.start("anything", "server", None) is None
    parent = TraceContext(TRACE, CLIENT_SPAN, "")
    context, span = tracing.begin("anything", "server", parent)
    assert span is None and context.trace_id == TRACE and context.parent_id == CLIENT_SPAN
