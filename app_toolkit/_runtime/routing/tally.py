"""What a caller counts of the requests a traffic policy sends elsewhere (a split's
variants, shadow copies), between two reports to the controller."""

from __future__ import annotations

import bisect

from app_toolkit._runtime.messages import Answer, CallFailure, HTTPResponse, HTTPResponseStart
from app_toolkit._runtime.tables import ShadowOutcome, VariantOutcome
from app_toolkit.metrics import SECONDS_BUCKETS


def failed(first: Answer) -> bool:
    """The first answer says the request failed: a raised call, or an HTTP 5xx."""
    if isinstance(first, HTTPResponse | HTTPResponseStart):
        return first.status >= 500
    return isinstance(first, CallFailure)


def answer_of(first: Answer) -> str:
    """What to compare a shadow's answer with the primary's on: the HTTP status, or
    whether a call raised."""
    if isinstance(first, HTTPResponse | HTTPResponseStart):
        return str(first.status)
    return "failed" if isinstance(first, CallFailure) else "ok"


def _bucket(seconds: float) -> int:
    return bisect.bisect_left(SECONDS_BUCKETS, seconds)


def _counts() -> list[int]:
    return [0] * (len(SECONDS_BUCKETS) + 1)


class VariantTally:
    """Requests, errors and latency counts of one variant, between two reports."""

    __slots__ = ("requests", "errors", "counts")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.counts = _counts()

    def add(self, seconds: float, error: bool) -> None:
        self.requests += 1
        self.errors += error
        self.counts[_bucket(seconds)] += 1

    def outcome(self, endpoint: str, variant: str) -> VariantOutcome:
        return VariantOutcome(endpoint, variant, self.requests, self.errors, tuple(self.counts))


class ShadowTally:
    """Shadow copies answered, their errors and differences, and copies dropped."""

    __slots__ = ("copies", "errors", "different", "dropped", "counts", "primary_counts")

    def __init__(self) -> None:
        self.copies = self.errors = self.different = self.dropped = 0
        self.counts = _counts()
        self.primary_counts = _counts()

    def add(self, seconds: float, primary_seconds: float, error: bool, different: bool) -> None:
        self.copies += 1
        self.errors += error
        self.different += different
        self.counts[_bucket(seconds)] += 1
        self.primary_counts[_bucket(primary_seconds)] += 1

    def outcome(self, endpoint: str, shadow: str) -> ShadowOutcome:
        return ShadowOutcome(
            endpoint,
            shadow,
            self.copies,
            self.errors,
            self.different,
            self.dropped,
            tuple(self.counts),
            tuple(self.primary_counts),
        )
