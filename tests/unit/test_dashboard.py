"""The dashboard's pure parts (quantiles, per-route rates, the state it sends) and who
may open it (addresses, the token and its cookie, the page's security headers)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from app_toolkit._runtime.front.dashboard_view import RouteRates, view
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit.config import HTTPOptions
from app_toolkit.metrics import FamilySnapshot, HistogramValue, quantile
from app_toolkit.status import (
    ApplicationStatus,
    ApplicationStatusInfo,
    DeploymentStatus,
    DeploymentStatusInfo,
    EventInfo,
    ReplicaState,
    ReplicaStatusInfo,
    ServeStatus,
    UpgradeStatusInfo,
)
from tests.unit.scopes import linked

BOUNDS = (0.001, 0.01, 0.1, 1.0, float("inf"))
LABELS = ("application", "route", "method", "status")


def histogram(*per_bucket: int) -> HistogramValue:
    """From counts per bucket (not cumulative), with a sum that does not matter here."""
    cumulative, total = [], 0
    for bound, count in zip(BOUNDS, per_bucket, strict=True):
        total += count
        cumulative.append((bound, total))
    return HistogramValue(tuple(cumulative), total, 0.0)


def durations(*samples: tuple[tuple[str, ...], HistogramValue]) -> FamilySnapshot:
    return FamilySnapshot(
        "app_toolkit_http_request_duration_seconds", "histogram", "", LABELS, tuple(samples)
    )


def test_quantiles_interpolate_inside_the_bucket_like_prometheus() -> None:
    buckets = histogram(0, 50, 50, 0, 0).buckets  # half in (1, 10] ms, half in (10, 100] ms
    assert quantile(buckets, 0.5) == pytest.approx(0.01)
    assert quantile(buckets, 0.25) == pytest.approx(0.0055)
    assert quantile(buckets, 0.99) == pytest.approx(0.01 + 0.09 * 0.98)
    # In the +Inf bucket: the last finite bound (as histogram_quantile answers).
    assert quantile(histogram(0, 0, 0, 1, 9).buckets, 0.99) == 1.0
    assert quantile(histogram(0, 0, 0, 0, 0).buckets, 0.5) is None
    assert quantile((), 0.5) is None


def test_route_rates_come_from_the_difference_between_two_samples() -> None:
    rates = RouteRates()
    get, post = ("shop", "/items/{id}", "GET", "200"), ("shop", "/items/{id}", "POST", "500")
    page = ("", "/-/metrics", "GET", "200")  # the proxy's own pages are no application's route
    first = rates.update(
        [durations((get, histogram(0, 10, 0, 0, 0)), (page, histogram(5, 0, 0, 0, 0)))], 100.0
    )
    assert first == [
        {
            "application": "shop",
            "route": "/items/{id}",
            "rate": 0.0,
            "p50_ms": None,
            "p99_ms": None,
            "total": 10,
        }
    ]
    # Two seconds later: 20 more GETs in (1, 10] ms and 20 POSTs in (10, 100] ms, merged.
    later = [durations((get, histogram(0, 30, 0, 0, 0)), (post, histogram(0, 0, 20, 0, 0)))]
    (row,) = rates.update(later, 102.0)
    assert row["rate"] == pytest.approx(20.0)
    assert row["p50_ms"] == pytest.approx(10.0)
    assert row["p99_ms"] == pytest.approx((0.01 + 0.09 * 0.98) * 1000)
    assert row["total"] == 50
    (idle,) = rates.update(later, 103.0)
    assert idle["rate"] == 0.0 and idle["p50_ms"] is None
    # A proxy that restarted counts from zero again: its counts are all new, not negative.
    (restarted,) = rates.update([durations((get, histogram(0, 4, 0, 0, 0)))], 104.0)
    assert restarted["rate"] == pytest.approx(4.0)


def _status() -> ServeStatus:
    replicas = [
        ReplicaStatusInfo("shop.Ingress.a", ReplicaState.RUNNING, "v1", "node-1"),
        ReplicaStatusInfo("shop.Ingress.b", ReplicaState.STARTING, "v1", "node-2"),
    ]
    upgrade = UpgradeStatusInfo("v2", 1, 0, 2, "surge", 0, 0, 0, "1 new replica starting", 3.0)
    deployment = DeploymentStatusInfo("Ingress", DeploymentStatus.UPDATING, "", 2, replicas, upgrade=upgrade)
    app = ApplicationStatusInfo(
        "shop", ApplicationStatus.DEPLOYING, "", "/shop", "Ingress", {"Ingress": deployment}
    )
    return ServeStatus({"shop": app}, events=[EventInfo(1.0, "WARNING", "Replica x is gone; replacing it")])


def test_the_state_joins_status_with_the_node_s_gauges() -> None:
    ongoing = FamilySnapshot(
        "app_toolkit_replica_ongoing_requests",
        "gauge",
        "",
        ("application", "deployment", "replica"),
        ((("shop", "Ingress", "shop.Ingress.a"), 3.0),),
    )
    queued = FamilySnapshot(
        "app_toolkit_caller_queued_requests",
        "gauge",
        "",
        ("application", "deployment", "caller"),
        ((("shop", "Ingress", "proxy"), 4.0), (("shop", "Ingress", "shop.Other.c"), 1.0)),
    )
    state = view(_status(), [[queued], [ongoing]], [], now=5.0)
    (app,) = state["applications"]
    (deployment,) = app["deployments"]
    assert (app["name"], app["status"], deployment["queued"]) == ("shop", "DEPLOYING", 5.0)
    assert deployment["upgrade"] == (
        "upgrade to v2: 0 new and 1 old running, of 2; surge; waiting for 1 new replica starting"
    )
    assert [(r["replica_id"], r["state"], r["ongoing"]) for r in deployment["replicas"]] == [
        ("shop.Ingress.a", "RUNNING", 3.0),
        ("shop.Ingress.b", "STARTING", None),  # not on this node: unknown, not zero
    ]
    assert state["events"] == [
        {"time": 1.0, "level": "WARNING", "message": "Replica x is gone; replacing it"}
    ]
    assert state["controller"] == ""
    down = view(None, [], [], now=5.0, status_error="the controller did not answer (TimeoutError)")
    assert down["controller"] == "the controller did not answer (TimeoutError)" and down["applications"] == []


class _Loaded:
    def watch(self, key: str, apply: Callable[[Any], None]) -> asyncio.Event:
        return asyncio.Event()  # never loaded: the dashboard answers anyway

    def dispatcher(self, deployment: Any) -> Any:
        return None


async def _get(options: HTTPOptions, client_address: str, path: str, **kwargs: Any) -> httpx.Response:
    proxy = HTTPFront(_Loaded(), options)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=linked(proxy), client=(client_address, 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        return await client.get(path, **kwargs)


TOKEN = "s3cret-token-of-some-length"


@pytest.mark.anyio
async def test_the_page_answers_loopback_by_default_with_strict_security_headers() -> None:
    page = await _get(HTTPOptions(), "127.0.0.1", "/-/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "dashboard/dashboard.js" in page.text and "http" not in page.text.replace("http-equiv", "")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy and "unsafe-inline" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    script = await _get(HTTPOptions(), "::1", "/-/dashboard/dashboard.js")
    assert script.status_code == 200 and "EventSource" in script.text
    assert "innerHTML" not in script.text  # server data is inserted as text only
    # Only the page's three files are served, by name; nothing else of the package.
    for path in ("/-/dashboard/index.html", "/-/dashboard/%2e%2e%2fdashboard.py", "/-/dashboard/x.js"):
        assert (await _get(HTTPOptions(), "127.0.0.1", path)).status_code == 404, path
    slash = await _get(HTTPOptions(), "127.0.0.1", "/-/dashboard/?token=x")
    assert slash.status_code == 307 and slash.headers["location"] == "../dashboard?token=x"


@pytest.mark.anyio
async def test_other_addresses_need_the_allow_list_or_the_token() -> None:
    refused = await _get(HTTPOptions(), "10.1.2.3", "/-/dashboard")
    assert refused.status_code == 403 and "dashboard_allow_ips" in refused.json()["detail"]
    listed = await _get(HTTPOptions(dashboard_allow_ips="10.0.0.0/8"), "10.1.2.3", "/-/dashboard")
    assert listed.status_code == 200
    with_token = HTTPOptions(dashboard_token=TOKEN)
    assert (await _get(with_token, "10.1.2.3", "/-/dashboard")).status_code == 403
    assert (
        await _get(with_token, "10.1.2.3", "/-/dashboard", params={"token": "wrong" * 4})
    ).status_code == 403
    opened = await _get(with_token, "10.1.2.3", "/-/dashboard", params={"token": TOKEN})
    assert opened.status_code == 200
    cookie = opened.headers["set-cookie"]
    assert cookie.startswith(f"app_toolkit_dashboard={TOKEN};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/-/dashboard" in cookie
    # The page's own requests carry the cookie; scripts and tools may send the header.
    jar = {"cookie": f"app_toolkit_dashboard={TOKEN}"}
    assert (await _get(with_token, "10.1.2.3", "/-/dashboard/dashboard.css", headers=jar)).status_code == 200
    bearer = {"authorization": f"Bearer {TOKEN}"}
    assert (
        await _get(with_token, "10.1.2.3", "/-/dashboard/dashboard.js", headers=bearer)
    ).status_code == 200
    assert (
        await _get(with_token, "10.1.2.3", "/-/dashboard", headers={"cookie": "a=b; c"})
    ).status_code == 403


def test_bad_dashboard_options_fail_with_what_to_fix() -> None:
    with pytest.raises(ValueError, match="at least 16 characters"):
        HTTPOptions(dashboard_token="short")
    with pytest.raises(ValueError, match="'everyone' is not an IP address"):
        HTTPOptions(dashboard_allow_ips="everyone")
