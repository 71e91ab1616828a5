"""An SSE route on a Redis event log, on both backends with two replicas: a reader that
drops its connection resumes with Last-Event-ID and gets the rest, no repeats, no gap."""

from __future__ import annotations

import threading
import time

import httpx

from tests.apps import resumable
from tests.conftest import Toolkit
from tests.draining import StreamReader, drain_replica


def _events(response: httpx.Response, stop_after: int | None = None) -> list[tuple[str, str]]:
    events: list[tuple[str, str]] = []
    event_id = ""
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            events.append((event_id, line[6:]))
            if stop_after is not None and len(events) == stop_after:
                break
    return events


def test_a_dropped_reader_resumes_by_last_event_id_on_any_replica(toolkit: Toolkit, redis_url: str) -> None:
    toolkit.run(resumable.make_app(redis_url, f"test:sse:{time.monotonic_ns()}:"), route_prefix="/resumable")
    with toolkit.client() as client:
        for _ in range(3):  # a few replies: the reader meets both replicas
            reply = client.post("/resumable/replies", params={"count": 8, "delay": 0.05}).json()["reply"]
            with client.stream("GET", f"/resumable/replies/{reply}") as response:
                assert response.status_code == 200
                first = _events(response, stop_after=3)  # then the connection drops
            assert [data for _, data in first] == ["piece 0", "piece 1", "piece 2"]
            headers = {"Last-Event-ID": first[-1][0]}
            with client.stream("GET", f"/resumable/replies/{reply}", headers=headers) as response:
                rest = _events(response)  # ends when the writer closes the reply
            assert [data for _, data in first + rest] == [f"piece {n}" for n in range(8)]
            assert len({event_id for event_id, _ in first + rest}) == 8

        assert client.get("/resumable/replies/no-such-reply").status_code == 404
        bad = client.get(f"/resumable/replies/{reply}", headers={"Last-Event-ID": "nonsense"})
        assert bad.status_code == 400 and "event id" in bad.json()["detail"]


def _read_events(reader: StreamReader) -> list[tuple[str, str]]:
    """The (id, data) of each event ``reader`` got but the drain's (which has no id)."""
    events: list[tuple[str, str]] = []
    event_id = ""
    for line in reader.text():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: ") and event_id:
            events.append((event_id, line[6:]))
            event_id = ""
    return events


def _reader_elsewhere(toolkit: Toolkit, path: str, replica: str) -> StreamReader:
    """A reader of ``path`` served by another replica than ``replica`` (those that land on
    it are left to read to the end)."""
    for _ in range(30):
        reader = StreamReader(toolkit, path)
        reader.wait_started()
        if reader.headers["x-replica"] != replica:
            return reader
    raise AssertionError(f"30 readers in a row were served by {replica}")


def test_a_resumable_stream_ends_when_its_replica_drains_and_resumes_on_another(
    toolkit: Toolkit, redis_url: str
) -> None:
    """Its replica's grace period is 30 s, yet the reader's stream ends as soon as the
    drain starts: the client resumes on the other replica, losing and repeating nothing."""
    prefix = f"test:sse:{time.monotonic_ns()}:"
    app = resumable.make_app(redis_url, prefix, graceful_shutdown_timeout_s=30)
    toolkit.run(app, route_prefix="/resumed")
    with toolkit.client() as client:
        started = client.post("/resumed/replies", params={"count": 40, "delay": 0.05})
    reply, writer = started.json()["reply"], started.headers["x-replica"]
    # The reader whose replica drains must read on another replica than the writer's: a
    # drained replica lets go of its instance (as it would before its process ends), and
    # a writer there stops writing, so there would be nothing more to resume (ci14).
    first = _reader_elsewhere(toolkit, f"/resumed/replies/{reply}", writer)
    began = time.monotonic()
    draining = threading.Thread(target=drain_replica, args=(toolkit, first.headers["x-replica"]))
    draining.start()
    first.join()
    assert first.text()[-3] == "event: drain"
    assert first.ended_at is not None and first.ended_at - began < 5  # not at the 30 s deadline
    seen = _read_events(first)
    rest = StreamReader(toolkit, f"/resumed/replies/{reply}", headers={"Last-Event-ID": seen[-1][0]})
    rest.join()
    draining.join(timeout=30)
    assert rest.headers["x-replica"] != first.headers["x-replica"]
    events = seen + _read_events(rest)
    assert [data for _, data in events] == [f"piece {n}" for n in range(40)]
    assert len({event_id for event_id, _ in events}) == 40
