"""A ``@continuable`` stream whose replica is SIGKILLed mid-stream goes on, on Ray: the
caller's stream continues on the other replica from the items it had, through a handle
and through HTTP, each item once and in order (docs/fault-tolerance.md, "Streams that go
on"). The same stream not declared continuable ends with the loss, as before, and so
does one whose items passed the bytes its caller keeps."""

from __future__ import annotations

import gc
import os
import signal

import httpx
import pytest

from app_toolkit import metrics
from app_toolkit._runtime.routing import continuations
from app_toolkit.exceptions import RequestLostError
from tests.apps.ray_only import Count, Counter, make_counting_app
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.metrics_page import continuations as counted_continuations

STOP = 40
KILL_AT = 10


def test_a_continuable_stream_goes_on_through_a_handle_when_its_replica_is_killed(
    ray_toolkit: Toolkit,
) -> None:
    counter = ray_toolkit.run(as_deployment(Counter).bind(), route_prefix=None)
    handle = counter.options(stream=True, method_name="count")
    numbers: list[int] = []
    pids: list[int] = []
    gc.collect()  # a stream an earlier test dropped gives its bytes back now, not during this one
    kept_before = kept = continuations.KEPT.used  # this process is the caller: what it keeps
    for number, pid in handle.remote(Count(STOP)):
        numbers.append(number)
        pids.append(pid)
        if number == KILL_AT:
            kept = continuations.KEPT.used
            os.kill(pid, signal.SIGKILL)  # the replica this test deployed, serving the stream
    assert numbers == list(range(STOP))  # each once, in order
    # What it kept of the stream, given back at the end.
    assert kept - kept_before >= (KILL_AT + 1) * 128 and continuations.KEPT.used == kept_before
    assert pids[KILL_AT] != pids[-1]  # the rest came from another replica
    assert set(pids[: KILL_AT + 1]) == {pids[0]}


@pytest.mark.parametrize("method", ["plain", "bounded"])
def test_a_stream_not_declared_continuable_or_past_its_bytes_ends_with_its_replica(
    ray_toolkit: Toolkit, method: str
) -> None:
    counter = ray_toolkit.run(as_deployment(Counter).bind(), route_prefix=None)
    handle = counter.options(stream=True, method_name=method)
    numbers: list[int] = []
    with pytest.raises(RequestLostError):
        for number, pid in handle.remote(Count(STOP)):
            numbers.append(number)
            if number == KILL_AT:
                os.kill(pid, signal.SIGKILL)
    assert numbers == list(range(KILL_AT + 1))
    # This process is the caller: the bounded stream's loss is counted as one it ended
    # (past its bytes); the plain one has no continuation to count.
    ended = metrics.value(
        "app_toolkit_stream_continuations_total", application=handle.app_name, method=method, outcome="ended"
    )
    assert ended == (1.0 if method == "bounded" else None)


def test_a_continuable_stream_goes_on_over_http_when_its_replica_is_killed(ray_toolkit: Toolkit) -> None:
    prefix = "/" + ray_toolkit.name()
    ray_toolkit.run(make_counting_app(as_deployment(Counter).bind()), route_prefix=prefix)
    before = counted_continuations(ray_toolkit.url)
    lines: list[tuple[int, int]] = []
    with httpx.Client(base_url=ray_toolkit.url, timeout=30) as client:
        with client.stream("GET", f"{prefix}/count/{STOP}") as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                number, pid = (int(part) for part in line.split())
                lines.append((number, pid))
                if number == KILL_AT:
                    os.kill(pid, signal.SIGKILL)
    assert [number for number, _ in lines] == list(range(STOP))
    assert lines[-1][1] != lines[KILL_AT][1]
    assert counted_continuations(ray_toolkit.url) >= before + 1  # counted by the caller's process
