"""An SSE route on a Redis event log, on both backends with two replicas: a reader that
drops its connection resumes with Last-Event-ID and gets the rest, no repeats, no gap."""

from __future__ import annotations

import time

import httpx

from tests.apps import resumable
from tests.conftest import Toolkit


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
