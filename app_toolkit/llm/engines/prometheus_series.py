"""A library's Prometheus series in this process (vLLM's ``vllm:*``, which it keeps in
prometheus-client's default registry) as :mod:`app_toolkit.metrics` families: added as a
source (``metrics.add_source``), ``/-/metrics`` shows them beside the toolkit's own,
labelled with the replica they come from. Counters, gauges and histograms are kept; other
kinds (info, summary) are left out."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from app_toolkit.metrics import FamilySnapshot, HistogramValue, Kind, Labels


def series(prefix: str, registry: CollectorRegistry = REGISTRY) -> Callable[[], list[FamilySnapshot]]:
    """A reader of the registry's series whose names start with ``prefix``."""

    def read() -> list[FamilySnapshot]:
        found = (_family(metric) for metric in registry.collect() if metric.name.startswith(prefix))
        return [family for family in found if family is not None]

    return read


def _family(metric: Metric) -> FamilySnapshot | None:
    if metric.type == "counter":
        return _plain(metric, "counter", metric.name + "_total")
    if metric.type == "gauge":
        return _plain(metric, "gauge", metric.name)
    if metric.type == "histogram":
        return _histogram(metric)
    return None


def _label_names(samples: Iterable[Sample]) -> tuple[str, ...]:
    names: dict[str, None] = {}
    for sample in samples:
        names.update(dict.fromkeys(name for name in sample.labels if name != "le"))
    return tuple(names)


def _key(sample: Sample, names: tuple[str, ...]) -> Labels:
    return tuple(sample.labels.get(name, "") for name in names)


def _plain(metric: Metric, kind: Kind, name: str) -> FamilySnapshot:
    samples = [sample for sample in metric.samples if sample.name == name]
    names = _label_names(samples)
    values = tuple((_key(sample, names), float(sample.value)) for sample in samples)
    return FamilySnapshot(name, kind, metric.documentation, names, values)


def _histogram(metric: Metric) -> FamilySnapshot:
    names = _label_names(metric.samples)
    buckets: dict[Labels, list[tuple[float, int]]] = {}
    counts: dict[Labels, int] = {}
    sums: dict[Labels, float] = {}
    for sample in metric.samples:
        key = _key(sample, names)
        if sample.name == metric.name + "_bucket":
            buckets.setdefault(key, []).append((float(sample.labels["le"]), int(sample.value)))
        elif sample.name == metric.name + "_count":
            counts[key] = int(sample.value)
        elif sample.name == metric.name + "_sum":
            sums[key] = float(sample.value)
    values = tuple(
        (key, HistogramValue(tuple(sorted(bounds)), counts.get(key, 0), sums.get(key, 0.0)))
        for key, bounds in buckets.items()
    )
    return FamilySnapshot(metric.name, "histogram", metric.documentation, names, values)
