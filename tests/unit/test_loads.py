"""Callers' load reports summed per deployment as they arrive (pure, with a fake clock)."""

from __future__ import annotations

from app_toolkit._runtime.controller.loads import LoadBook
from app_toolkit._runtime.messages import DeploymentID

A = DeploymentID("a", "D")
B = DeploymentID("b", "D")


def test_reports_of_several_callers_add_up_and_a_new_report_replaces_the_old() -> None:
    book = LoadBook(ttl_s=10.0)
    book.record("proxy-1", {A: 3.0, B: 1.0}, now=0.0)
    book.record("proxy-2", {A: 2.0}, now=1.0)
    assert (book.total(A, now=1.0), book.total(B, now=1.0)) == (5.0, 1.0)
    book.record("proxy-1", {A: 1.0}, now=2.0)  # proxy-1 no longer calls B
    assert (book.total(A, now=2.0), book.total(B, now=2.0)) == (3.0, 0.0)
    assert book.total(DeploymentID("never", "D"), now=2.0) == 0.0
    assert book.callers() == 2


def test_a_caller_silent_for_the_ttl_stops_counting_and_its_sums_leave_no_residue() -> None:
    book = LoadBook(ttl_s=10.0)
    book.record("proxy-1", {A: 0.1}, now=0.0)
    book.record("proxy-2", {A: 0.2}, now=5.0)
    book.record("proxy-1", {A: 0.7}, now=6.0)  # a fresh report restarts proxy-1's TTL
    assert book.total(A, now=15.0) == 0.1 + 0.2 - 0.1 + 0.7  # the same float sum, in that order
    assert book.total(A, now=15.5) == 0.7  # proxy-2 (last heard at 5.0) expired
    assert book.callers() == 1
    # Once nobody reports A its total is exactly 0: a residue such as 1e-17 would read as
    # demand to a deployment scaled to zero.
    assert book.total(A, now=16.5) == 0.0
    assert book.callers() == 0


def test_a_report_at_the_edge_of_the_ttl_still_counts() -> None:
    book = LoadBook(ttl_s=10.0)
    book.record("handle", {A: 4.0}, now=0.0)
    assert book.total(A, now=10.0) == 4.0
    assert book.total(A, now=10.001) == 0.0


def test_thousands_of_reports_keep_one_entry_per_caller() -> None:
    book = LoadBook(ttl_s=10.0)
    for tick in range(5000):
        book.record(f"proxy-{tick % 50}", {A: 1.0, B: float(tick % 3)}, now=tick * 0.01)
    assert book.callers() == 50
    assert book.total(A, now=50.0) == 50.0
    expected_b = sum(float(tick % 3) for tick in range(4950, 5000))
    assert book.total(B, now=50.0) == expected_b


def test_reports_are_kept_under_one_key_object_per_deployment() -> None:
    book = LoadBook(ttl_s=10.0)
    first, second = DeploymentID("a", "D"), DeploymentID("a", "D")  # equal, not the same object
    book.record("proxy-1", {first: 1.0}, now=0.0)
    book.record("proxy-2", {second: 2.0}, now=0.0)
    kept = [next(iter(loads)) for _, loads in book._reports.values()]
    assert kept[0] is kept[1] is first
    assert book.total(second, now=0.0) == 3.0
    book.record("proxy-1", {}, now=20.0)  # both reports of A gone: its key is let go
    assert book.total(first, now=20.0) == 0.0 and not book._keys
