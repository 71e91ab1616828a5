"""The metrics registry, the Prometheus page it renders to, and who may read it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app_toolkit import metrics
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit._runtime.front.metrics_page import render
from app_toolkit.config import HTTPOptions
from app_toolkit.config.allow_ips import allowed, parse_networks
from app_toolkit.metrics import FamilySnapshot, HistogramValue
from tests.unit.scopes import linked


@pytest.fixture(autouse=True)
def _no_process_labels() -> Any:
    yield
    metrics.set_process_labels()


def test_a_counter_of_a_histogram_counts_its_observations_and_is_not_increased() -> None:
    took = metrics.Histogram("test_took_seconds", "Took", ("route",), buckets=(0.1,))
    served = metrics.Counter("test_served_total", "Served", ("route",), counts=took)
    for seconds in (0.05, 0.5, 0.2):
        took.observe(seconds, "/a")
    took.observe(0.01, "/b")
    assert metrics.value("test_served_total", route="/a") == 3
    assert dict(served.snapshot().samples) == {("/a",): 3.0, ("/b",): 1.0}
    with pytest.raises(TypeError, match="observe those"):
        served.inc("/a")
    with pytest.raises(ValueError, match="takes its labels"):
        metrics.Counter("test_other_total", "Other", ("app",), counts=took)


def test_counters_gauges_and_histograms_record_by_label() -> None:
    orders = metrics.Counter("test_orders_total", "Orders", ("kind",))
    orders.inc("book")
    orders.inc("book", amount=2)
    orders.inc("pen")
    assert metrics.value("test_orders_total", kind="book") == 3
    with pytest.raises(ValueError, match="takes labels"):
        orders.inc("book", "extra")
    level = metrics.Gauge("test_level", "Level", read=lambda: {(): 7.0})
    assert level.snapshot().samples == (((), 7.0),)
    waits = metrics.Histogram("test_wait_seconds", "Waits", ("queue",), buckets=(0.1, 1.0))
    for seconds in (0.05, 0.5, 0.5, 3.0):
        waits.observe(seconds, "q")
    found = metrics.value("test_wait_seconds", queue="q")
    assert isinstance(found, HistogramValue)
    assert found.buckets == ((0.1, 1), (1.0, 3), (float("inf"), 4))
    assert (found.count, found.sum, found.mean) == (4, 4.05, 4.05 / 4)
    with pytest.raises(ValueError, match="exists as a counter"):
        metrics.Gauge("test_orders_total", "Orders again", ("kind",))


def test_process_labels_are_added_unless_the_metric_has_its_own() -> None:
    own = metrics.Counter("test_own_total", "Own", ("replica",))
    own.inc("mine")
    plain = metrics.Counter("test_plain_total", "Plain")
    plain.inc()
    metrics.set_process_labels(replica="r1")
    assert own.snapshot().labelnames == ("replica",) and own.snapshot().samples == ((("mine",), 1.0),)
    assert plain.snapshot().labelnames == ("replica",) and plain.snapshot().samples == ((("r1",), 1.0),)


def test_the_page_merges_processes_and_parses_back() -> None:
    def process(replica: str, served: float) -> list[FamilySnapshot]:
        return [
            FamilySnapshot(
                "demo_requests_total", "counter", "Requests", ("replica",), (((replica,), served),)
            ),
            FamilySnapshot(
                "demo_seconds",
                "histogram",
                "Latency",
                ("replica",),
                (((replica,), HistogramValue(((0.5, 1), (float("inf"), 2)), 2, 1.25)),),
            ),
        ]

    text = render([process("a", 3), process('b"\n', 4)]).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    counted = {s.labels["replica"]: s.value for s in families["demo_requests"].samples}
    assert counted == {"a": 3, 'b"\n': 4}  # a hostile label value stays one sample
    assert families["demo_requests"].type == "counter"
    latency = families["demo_seconds"].samples
    buckets = [(s.labels["le"], s.value) for s in latency if s.name.endswith("_bucket")]
    assert buckets[:2] == [("0.5", 1), ("+Inf", 2)]
    sums = [s.value for s in latency if s.name == "demo_seconds_sum"]
    assert sums == [1.25, 1.25]


def test_who_may_read_metrics() -> None:
    loopback = parse_networks("127.0.0.1, ::1")
    assert allowed(loopback, "127.0.0.1") and allowed(loopback, "::1")
    assert allowed(loopback, "::ffff:127.0.0.1")  # an IPv4 client on a dual-stack socket
    assert not allowed(loopback, "10.0.0.7") and not allowed(loopback, None)
    assert not allowed(loopback, "unix-socket-peer")
    assert allowed(parse_networks("10.0.0.0/8"), "10.2.3.4")
    assert allowed(parse_networks("*"), "203.0.113.9")
    with pytest.raises(ValueError, match="'10.0.0.300' is not an IP address"):
        HTTPOptions(metrics_allow_ips="10.0.0.300")


class _Loaded:
    def watch(self, key: str, apply: Callable[[Any], None]) -> asyncio.Event:
        return asyncio.Event()  # never loaded: /-/metrics answers anyway

    def dispatcher(self, deployment: Any) -> Any:
        return None


@pytest.mark.anyio
async def test_the_endpoint_answers_allowed_addresses_only_even_before_routes_load() -> None:
    metrics.Counter("test_page_total", "On the page").inc()
    for client_address, options, status in (
        ("127.0.0.1", HTTPOptions(), 200),
        ("10.1.2.3", HTTPOptions(), 403),
        ("10.1.2.3", HTTPOptions(metrics_allow_ips="10.0.0.0/8"), 200),
    ):
        proxy = HTTPFront(_Loaded(), options)  # type: ignore[arg-type]
        transport = httpx.ASGITransport(app=linked(proxy), client=(client_address, 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            response = await client.get("/-/metrics")
        assert response.status_code == status, (client_address, response.text)
        if status == 200:
            assert "test_page_total 1.0" in response.text
        else:
            assert "metrics_allow_ips" in response.json()["detail"]
