"""Reading a node's ``/-/metrics`` page in tests."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def continuations(url: str, outcome: str = "continued") -> float:
    """Streams continued (``outcome="continued"``) or ended after a loss (``"ended"``), as
    the callers on the node at ``url`` count them (``app_toolkit_stream_continuations_total``)."""
    text = httpx.get(url + "/-/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "app_toolkit_stream_continuations"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("outcome") == outcome
    )
