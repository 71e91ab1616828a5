"""/-/metrics on both backends: scraped over HTTP, parsed with prometheus-client's own
parser, counts matching the requests sent per application, route and replica."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.apps import basic, streams
from tests.conftest import Toolkit
from tests.waiting import wait_for


def _samples(text: str) -> list[Sample]:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def _total(samples: Iterable[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def test_metrics_count_requests_per_application_route_and_replica(toolkit: Toolkit) -> None:
    shop, other = toolkit.name(), toolkit.name()
    toolkit.run(basic.make_app(num_replicas=2), name=shop, route_prefix="/m-shop")
    toolkit.run(basic.make_app(num_replicas=2), name=other, route_prefix="/m-other")
    for i in range(30):
        # New connections: on Ray each is served by the replica it was handed to.
        with toolkit.client() as fresh:
            assert fresh.get(f"/m-shop/items/{i}").status_code == 200
    with toolkit.client() as client:
        for i in range(20):
            assert client.get(f"/m-other/items/{i}").status_code == 200
        assert client.get("/m-shop/boom").status_code == 500
        assert client.get("/m-shop/no-such-route").status_code == 404

        def scraped() -> list[Sample] | None:
            response = client.get("/-/metrics")
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
            samples = _samples(response.text)
            done = _total(samples, "app_toolkit_replica_requests_total", application=other) == 20
            return samples if done else None

        samples = wait_for(scraped, 15, "every request to be counted")

    requests = "app_toolkit_http_requests_total"
    items = {"route": "/m-shop/items/{item_id}", "method": "GET"}
    assert _total(samples, requests, application=shop, status="200", **items) == 30
    assert _total(samples, requests, application=other, route="/m-other/items/{item_id}") == 20
    assert _total(samples, requests, application=shop, route="/m-shop/boom", status="500") == 1
    # A path the app does not know is counted under the prefix, never under the raw path.
    assert _total(samples, requests, application=shop, route="/m-shop", status="404") == 1
    assert not [s for s in samples if "no-such-route" in str(s.labels)]
    duration = "app_toolkit_http_request_duration_seconds_count"
    assert _total(samples, duration, application=shop, status="200", **items) == 30

    # Each replica counts what it ran; together, every request (both replicas served some).
    served = [
        s
        for s in samples
        if s.name == "app_toolkit_replica_requests_total"
        and s.labels["application"] == shop
        and s.labels["route"] == "/items/{item_id}"
    ]
    assert len({s.labels["replica"] for s in served}) == 2 and sum(s.value for s in served) == 30
    assert all(s.labels["kind"] == "http" for s in served)
    ongoing = [s for s in samples if s.name == "app_toolkit_replica_ongoing_requests"]
    assert {s.labels["replica"] for s in served} <= {s.labels["replica"] for s in ongoing}

    # The controller's view: two replicas wanted and running for each app.
    for app in (shop, other):
        assert _total(samples, "app_toolkit_deployment_target_replicas", application=app) == 2
        assert _total(samples, "app_toolkit_deployment_replicas", application=app, state="RUNNING") == 2
        assert _total(samples, "app_toolkit_replica_starts_total", application=app) == 2


def test_metrics_cover_streams_and_handle_calls(toolkit: Toolkit) -> None:
    events, greet = toolkit.name(), toolkit.name()
    toolkit.run(streams.make_app(), name=events, route_prefix="/m-events")
    toolkit.run(basic.make_depends_app(), name=greet, route_prefix="/m-greet")
    with toolkit.client() as client:
        for _ in range(2):
            streamed = client.get("/m-events/events", params={"count": 3})
            assert streamed.status_code == 200 and streamed.text.count("data:") == 3
        for name in ("a", "b", "c", "d"):
            assert client.get(f"/m-greet/greet/{name}").status_code == 200

        def scraped() -> list[Sample] | None:
            samples = _samples(client.get("/-/metrics").text)
            calls = "app_toolkit_handle_request_seconds_count"
            done = _total(samples, calls, application=greet) == 4
            return samples if done else None

        samples = wait_for(scraped, 15, "the handle calls to be counted")
    route = {"application": events, "route": "/m-events/events"}
    assert _total(samples, "app_toolkit_stream_first_chunk_seconds_count", **route) == 2
    assert _total(samples, "app_toolkit_stream_chunks_total", **route) >= 6  # 3 events each
    assert _total(samples, "app_toolkit_open_streams", application=events, kind="stream") == 0  # both ended
    calls = "app_toolkit_handle_request_seconds_count"
    assert (
        _total(samples, calls, application=greet, deployment="Configured", method="greet", outcome="ok") == 4
    )
