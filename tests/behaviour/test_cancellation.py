"""Client disconnects and deadlines cancel the work wherever it is (both backends)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest

from tests import plain_http
from tests.apps import basic
from tests.conftest import Toolkit
from tests.waiting import wait_for


def wait_for_file(path: Path, timeout_s: float = 20.0) -> None:
    wait_for(path.exists, timeout_s, f"{path.name} to appear", interval_s=0.02)


def test_disconnect_cancels_the_running_handler(toolkit: Toolkit, tmp_path: Path) -> None:
    toolkit.run(basic.make_app(), route_prefix="/dc")
    started, cancelled = tmp_path / "started", tmp_path / "cancelled"
    params: dict[str, str | int] = {"seconds": 30, "marker": str(started), "cancelled": str(cancelled)}
    with pytest.raises(httpx.ReadTimeout):
        # The client gives up after 2 s (the handler would take 30) and hangs up.
        plain_http.get(toolkit.url + "/dc/sleep", params=params, timeout=2.0)
    wait_for_file(started)
    wait_for_file(cancelled)  # the handler saw CancelledError
    with toolkit.client() as client:  # and the slot is free again
        assert client.get("/dc/items/1").status_code == 200


def test_disconnect_while_queued_never_runs(toolkit: Toolkit, tmp_path: Path) -> None:
    toolkit.run(basic.make_app(max_ongoing_requests=1), route_prefix="/dq")
    first = tmp_path / "first"
    queued = tmp_path / "queued"
    with httpx.Client(base_url=toolkit.url, timeout=30) as client:
        import threading

        holder = threading.Thread(
            target=lambda: client.get("/dq/sleep", params={"seconds": 2, "marker": str(first)})
        )
        holder.start()
        wait_for_file(first)
        with pytest.raises(httpx.ReadTimeout):
            plain_http.get(
                toolkit.url + "/dq/sleep", params={"seconds": 0, "marker": str(queued)}, timeout=0.5
            )
        holder.join()
        assert client.get("/dq/items/2").status_code == 200
    assert not queued.exists()  # it was dropped from the queue, never sent


def test_request_deadline_header_gives_504_and_cancels(toolkit: Toolkit, tmp_path: Path) -> None:
    toolkit.run(basic.make_app(), route_prefix="/dl")
    cancelled = tmp_path / "cancelled"
    with toolkit.client() as client:
        response = client.get(
            "/dl/sleep",
            params={"seconds": 30, "cancelled": str(cancelled)},
            headers={"x-request-timeout-seconds": "2"},
        )
        assert response.status_code == 504
        assert response.json()["request_id"] == response.headers["x-request-id"]
        wait_for_file(cancelled)
        fast = client.get("/dl/sleep", params={"seconds": 0}, headers={"x-request-timeout-seconds": "5"})
        assert fast.status_code == 200
        bad = client.get("/dl/items/1", headers={"x-request-timeout-seconds": "soon"})
        assert bad.status_code == 400
        assert "x-request-timeout-seconds must be a number" in bad.json()["detail"]


def _answer_to_an_unfinished_upload(toolkit: Toolkit, request_line: str) -> bytes:
    """What a request whose body never finishes arriving gets, its deadline 1 s."""
    host, port = toolkit.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"{request_line} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n".encode()
            + b'content-length: 100\r\nx-request-timeout-seconds: 1\r\n\r\n{"name": '
        )
        started = time.monotonic()
        answer = b""
        while not answer.endswith(b"}"):  # the rest of the request body never comes
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert time.monotonic() - started < 5
    return answer


def test_the_request_deadline_covers_a_slow_upload_not_a_body_the_app_leaves_unread(
    toolkit: Toolkit,
) -> None:
    toolkit.run(basic.make_app(), route_prefix="/up")
    # A body still arriving when the deadline passes is the upload's lateness (408),
    # whether the app waits for it or has not asked for it yet.
    for request_line in ("POST /up/items", "GET /up/sleep?seconds=30"):
        answer = _answer_to_an_unfinished_upload(toolkit, request_line)
        assert answer.startswith(b"HTTP/1.1 408 "), (request_line, answer)
        assert b"did not arrive within the deadline of 1.0 s" in answer
    # A body that arrived whole, which the app never reads while it overruns the
    # deadline, is the app's (504).
    with httpx.Client(base_url=toolkit.url, timeout=10) as client:
        late = client.request(
            "GET",
            "/up/sleep",
            params={"seconds": 30},
            content=b"x" * 100,
            headers={"x-request-timeout-seconds": "1"},
        )
    assert late.status_code == 504, late.text
    assert "took longer than 1.0 s" in late.json()["detail"]
