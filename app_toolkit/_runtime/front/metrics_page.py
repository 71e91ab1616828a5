"""``GET /-/metrics``: every toolkit process of this node in the Prometheus text format.

The proxy gathers the snapshots (``app_toolkit.metrics``) of its own process and of the
node's other toolkit processes when scraped, off the request path, and renders them with
prometheus-client. Who may read it is ``HTTPOptions.metrics_allow_ips``
(``config/allow_ips.py``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from app_toolkit.metrics import FamilySnapshot, HistogramValue

#: Snapshots of every process the page covers, one list per process.
Gather = Callable[[], Awaitable[list[list[FamilySnapshot]]]]
#: What ``generate_latest`` writes: the text format 0.0.4 (prometheus-client names this
#: constant only from 0.23 on).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render(processes: Iterable[list[FamilySnapshot]]) -> bytes:
    """The Prometheus text of all these processes' metrics (same names merged)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(list(processes)))
    return generate_latest(registry)


class _Collector:
    def __init__(self, processes: list[list[FamilySnapshot]]) -> None:
        self._processes = processes

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for families in self._processes:
            for family in families:
                metric = merged.get(family.name)
                if metric is None:
                    base = family.name.removesuffix("_total") if family.kind == "counter" else family.name
                    metric = merged[family.name] = Metric(base, family.help, family.kind)
                for labels, value in family.samples:
                    named = dict(zip(family.labelnames, labels, strict=True))
                    _add(metric, family, named, value)
        yield from merged.values()


def _add(
    metric: Metric, family: FamilySnapshot, labels: dict[str, str], value: float | HistogramValue
) -> None:
    if isinstance(value, HistogramValue):
        for bound, count in value.buckets:
            le = "+Inf" if math.isinf(bound) else repr(float(bound))
            metric.add_sample(f"{family.name}_bucket", {**labels, "le": le}, float(count))
        metric.add_sample(f"{family.name}_count", labels, float(value.count))
        metric.add_sample(f"{family.name}_sum", labels, value.sum)
    elif family.kind == "counter":
        metric.add_sample(f"{metric.name}_total", labels, value)
    else:
        metric.add_sample(family.name, labels, value)
