"""A library's Prometheus series (vLLM's ``vllm:*``) read into the toolkit's metrics: a
source of ``app_toolkit.metrics`` whose families the page renders as this process's own."""

from __future__ import annotations

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from app_toolkit import metrics
from app_toolkit._runtime.front.metrics_page import render
from app_toolkit.llm.engines.prometheus_series import series
from app_toolkit.metrics import FamilySnapshot


def test_a_librarys_prometheus_series_join_the_snapshot_as_this_processs_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    running = prometheus_client.Gauge(
        "vllm:num_requests_running", "Running", ("model_name",), registry=registry
    )
    running.labels("m").set(2)
    tokens = prometheus_client.Counter("vllm:generation_tokens", "Tokens", ("model_name",), registry=registry)
    tokens.labels("m").inc(7)
    latency = prometheus_client.Histogram(
        "vllm:e2e_request_latency_seconds", "Latency", ("model_name",), buckets=(0.5,), registry=registry
    )
    latency.labels("m").observe(0.25)
    latency.labels("m").observe(2.0)
    prometheus_client.Info("vllm:cache_config", "Config", registry=registry).info({"block_size": "16"})
    prometheus_client.Gauge("other_running", "Not vLLM's", registry=registry).set(1)

    def broken() -> list[FamilySnapshot]:
        raise RuntimeError("the registry is gone")

    metrics.set_process_labels(replica="r1")
    metrics.add_source("test-vllm", series("vllm:", registry))
    metrics.add_source("test-broken", broken)
    try:
        text = render([metrics.snapshot()]).decode()
        metrics.snapshot()  # the broken source again: logged once
    finally:
        metrics.remove_source("test-vllm")
        metrics.remove_source("test-broken")
        metrics.set_process_labels()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    labels = {"model_name": "m", "replica": "r1"}
    assert [(s.labels, s.value) for s in families["vllm:num_requests_running"].samples] == [(labels, 2.0)]
    assert families["vllm:generation_tokens"].type == "counter"
    assert [(s.name, s.value) for s in families["vllm:generation_tokens"].samples] == [
        ("vllm:generation_tokens_total", 7.0)
    ]
    histogram = [
        (s.name, s.labels.get("le"), s.value) for s in families["vllm:e2e_request_latency_seconds"].samples
    ]
    assert histogram == [
        ("vllm:e2e_request_latency_seconds_bucket", "0.5", 1.0),
        ("vllm:e2e_request_latency_seconds_bucket", "+Inf", 2.0),
        ("vllm:e2e_request_latency_seconds_count", None, 2.0),
        ("vllm:e2e_request_latency_seconds_sum", None, 2.25),
    ]
    assert "other_running" not in families and "vllm:cache_config" not in families  # another prefix; an info
    assert [r.getMessage() for r in caplog.records if "test-broken" in r.getMessage()] == [
        "Metrics source test-broken failed; left out while it fails"
    ]
    assert not [family for family in metrics.snapshot() if family.name.startswith("vllm:")]  # removed
