"""The toolkit started, used and stopped from different threads of one process (#17 e)."""

from __future__ import annotations

from tests.conftest import free_port
from tests.scenario import run_scenario


def test_started_from_a_thread_that_ends_it_keeps_serving_and_stops_cleanly() -> None:
    seen = run_scenario("tests.integration.thread_scenario", str(free_port()), timeout_s=180)
    # status() with nothing running answers empty and starts nothing (Ray Serve does the same).
    assert seen["status_before"] == {
        "applications": {},
        "proxies": {},
        "proxy_urls": {},
        "events": [],
        "spare_replicas": {},
        "target_capacity": None,
        "draining_nodes": [],
    }
    assert seen["ray_started_by_status"] is False
    assert seen["http"] == 200
    assert seen["apps"] == ["threads"]
    assert seen["shutdown_s"] < 30
