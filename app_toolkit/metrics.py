"""Metrics kept in each process: counters, gauges and histograms with labels.

Recording is a dictionary update: it never blocks, never does I/O and never raises for
a well-formed call. Nothing is exported from here: the proxy's ``/-/metrics`` reads
:func:`snapshot` of every toolkit process on its node, off the request path, and renders
the Prometheus text format. Names follow Prometheus conventions (``_total``,
``_seconds``); label values are strings.

User code may define its own metrics the same way (``Counter("shop_orders_total",
"Orders placed", ("kind",))`` at module level, then ``.inc("book")``); they appear in
the same scrape, labelled with the replica they come from.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

#: Bucket upper bounds for sizes (items) and for durations (seconds).
SIZE_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
SECONDS_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

logger = logging.getLogger("app_toolkit.metrics")

Kind = Literal["counter", "gauge", "histogram"]
Labels = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class HistogramValue:
    """Cumulative counts per upper bound (the last is +Inf), the count and the sum."""

    buckets: tuple[tuple[float, int], ...]
    count: int
    sum: float

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0


@dataclass(frozen=True, slots=True)
class FamilySnapshot:
    """One metric's samples at one moment, as plain data (it crosses processes)."""

    name: str
    kind: Kind
    help: str
    labelnames: tuple[str, ...]
    samples: tuple[tuple[Labels, float | HistogramValue], ...]


_lock = threading.Lock()
_families: dict[str, _Family] = {}
#: Families this process keeps elsewhere, read at each snapshot (``add_source``).
_sources: dict[str, Callable[[], list[FamilySnapshot]]] = {}
_failing: set[str] = set()  # sources whose failure is logged (once, until they read again)
#: Labels added to every sample of this process (e.g. the replica it is), set once at start.
_process_labels: dict[str, str] = {}


def set_process_labels(**labels: str) -> None:
    """Label every metric of this process with these (a replica: its application,
    deployment and replica id), unless the metric has a label of the same name."""
    _process_labels.clear()
    _process_labels.update(labels)


class _Family:
    kind: Kind

    def __init__(self, name: str, help: str, labelnames: tuple[str, ...] = ()) -> None:
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        with _lock:
            existing = _families.get(name)
            if existing is not None and (existing.kind, existing.labelnames) != (self.kind, self.labelnames):
                raise ValueError(
                    f"Metric {name!r} exists as a {existing.kind} with labels {existing.labelnames}"
                )
            _families[name] = self

    def _check(self, labels: Labels) -> None:
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {labels}")

    def _samples(self) -> list[tuple[Labels, float | HistogramValue]]:
        raise NotImplementedError

    def snapshot(self) -> FamilySnapshot:
        return _labelled(
            FamilySnapshot(self.name, self.kind, self.help, self.labelnames, tuple(self._samples()))
        )


def _labelled(family: FamilySnapshot) -> FamilySnapshot:
    """``family`` with this process's labels added (those it has not of its own)."""
    extra = tuple(key for key in _process_labels if key not in family.labelnames)
    if not extra:
        return family
    added = tuple(_process_labels[key] for key in extra)
    return FamilySnapshot(
        family.name,
        family.kind,
        family.help,
        family.labelnames + extra,
        tuple((labels + added, value) for labels, value in family.samples),
    )


class Counter(_Family):
    """A count that only goes up. ``counts``: a histogram with the same labels whose
    observations this counts (a request's duration observed is a request counted: one
    record per event, not two); such a counter is read, not increased."""

    kind: Kind = "counter"

    def __init__(
        self, name: str, help: str, labelnames: tuple[str, ...] = (), counts: Histogram | None = None
    ) -> None:
        if counts is not None and counts.labelnames != tuple(labelnames):
            raise ValueError(f"{name} counts {counts.name}, so it takes its labels {counts.labelnames}")
        super().__init__(name, help, labelnames)
        self._values: dict[Labels, float] = {}
        self._counts = counts

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        if self._counts is not None:
            raise TypeError(f"{self.name} counts {self._counts.name}'s observations: observe those")
        values = self._values
        if labels not in values:
            self._check(labels)
        values[labels] = values.get(labels, 0.0) + amount

    def _samples(self) -> list[tuple[Labels, float | HistogramValue]]:
        if self._counts is not None:
            return [(labels, float(found.count)) for labels, found in list(self._counts._values.items())]
        return list(self._values.items())


class Gauge(_Family):
    """A value that goes up and down, or one read from a function at each snapshot."""

    kind: Kind = "gauge"

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: tuple[str, ...] = (),
        read: Callable[[], dict[Labels, float]] | None = None,
    ) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[Labels, float] = {}
        self._read = read

    def set(self, value: float, *labels: str) -> None:
        if labels not in self._values:
            self._check(labels)
        self._values[labels] = value

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        self.set(self._values.get(labels, 0.0) + amount, *labels)

    def dec(self, *labels: str, amount: float = 1.0) -> None:
        self.inc(*labels, amount=-amount)

    def _samples(self) -> list[tuple[Labels, float | HistogramValue]]:
        if self._read is None:
            return list(self._values.items())
        return list(self._read().items())


@dataclass
class _Buckets:
    counts: list[int]
    count: int = 0
    total: float = field(default=0.0)


class Histogram(_Family):
    """Observations counted per bucket, with their sum."""

    kind: Kind = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: tuple[str, ...] = (),
        buckets: tuple[float, ...] = SECONDS_BUCKETS,
    ) -> None:
        super().__init__(name, help, labelnames)
        self.buckets = tuple(sorted(buckets))
        self._values: dict[Labels, _Buckets] = {}  # also read by a Counter that ``counts`` it

    def observe(self, value: float, *labels: str) -> None:
        found = self._values.get(labels)
        if found is None:
            self._check(labels)
            found = self._values[labels] = _Buckets([0] * (len(self.buckets) + 1))
        found.counts[bisect.bisect_left(self.buckets, value)] += 1
        found.count += 1
        found.total += value

    def _samples(self) -> list[tuple[Labels, float | HistogramValue]]:
        samples: list[tuple[Labels, float | HistogramValue]] = []
        for labels, found in list(self._values.items()):
            cumulative, running = [], 0
            for bound, count in zip((*self.buckets, float("inf")), found.counts, strict=True):
                running += count
                cumulative.append((bound, running))
            samples.append((labels, HistogramValue(tuple(cumulative), found.count, found.total)))
        return samples


def add_source(name: str, read: Callable[[], list[FamilySnapshot]]) -> None:
    """Add the families a library keeps in this process (vLLM's Prometheus series), read
    at each :func:`snapshot` and labelled as this process's own; ``name`` replaces a source
    added before under it. A source that fails is left out of the snapshot (logged once,
    until it reads again)."""
    with _lock:
        _sources[name] = read


def remove_source(name: str) -> None:
    """Stop reading the source added as ``name`` (none: nothing happens)."""
    with _lock:
        _sources.pop(name, None)


def snapshot() -> list[FamilySnapshot]:
    """Every metric of this process, with its current samples."""
    with _lock:
        families = list(_families.values())
        sources = list(_sources.items())
    found = [family.snapshot() for family in families]
    for name, read in sources:
        try:
            found.extend(_labelled(family) for family in read())
        except Exception:  # a library's registry must not break the scrape
            with _lock:
                first = name not in _failing
                _failing.add(name)
            if first:
                logger.warning("Metrics source %s failed; left out while it fails", name, exc_info=True)
        else:
            with _lock:
                _failing.discard(name)
    return found


def value(name: str, **labels: str) -> float | HistogramValue | None:
    """This process's sample of ``name`` with (at least) these labels; None if none."""
    with _lock:
        family = _families.get(name)
    if family is None:
        return None
    found = family.snapshot()
    for sample_labels, sample in found.samples:
        named = dict(zip(found.labelnames, sample_labels, strict=True))
        if all(named.get(key) == wanted for key, wanted in labels.items()):
            return sample
    return None


def quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of a histogram given as cumulative counts per upper bound (the
    last +Inf), interpolated linearly inside its bucket as Prometheus does; None when it
    holds nothing. A quantile in the +Inf bucket is reported as the last finite bound."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            share = (rank - lower_count) / (count - lower_count) if count > lower_count else 1.0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound
