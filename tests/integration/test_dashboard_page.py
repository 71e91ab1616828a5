"""The /-/dashboard page in headless Chromium on a real local Ray cluster: two apps and
their replicas, a killed replica replaced on the page within seconds, load moving the
request-rate chart; readable at 1280×800 and at a phone's width."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import ray
from playwright.sync_api import Browser, Page, Route

from app_toolkit._runtime.backends.ray.cluster import replica_actor
from tests.apps import basic
from tests.browser import chromium
from tests.conftest import Toolkit
from tests.waiting import wait_for

#: Where to save the screenshot the docs show (docs/img/dashboard.png), when set.
SCREENSHOT_ENV = "APP_TOOLKIT_DOCS_SCREENSHOT"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


def _running(page: Page, app: str) -> list[str]:
    rows = page.locator(f'article[data-app="{app}"] tr.replica[data-state="RUNNING"]')
    return [rows.nth(i).get_attribute("data-replica") or "" for i in range(rows.count())]


def _overflows(page: Page) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth > document.documentElement.clientWidth"))


def _chart(page: Page, app: str) -> str:
    """The rate chart of ``app``'s route as an image (data URL); "" if not drawn yet."""
    chart = page.locator(f'.route[data-app="{app}"] canvas.rate-chart')
    return str(chart.evaluate("c => c.toDataURL()")) if chart.count() else ""


def test_the_page_shows_apps_replacements_and_load(
    browser: Browser, ray_toolkit: Toolkit, tmp_path: Path
) -> None:
    shop, other = ray_toolkit.name(), ray_toolkit.name()
    checks = {"health_check_period_s": 0.5, "health_check_timeout_s": 2}
    ray_toolkit.run(basic.make_app(num_replicas=2, **checks), name=shop, route_prefix="/page-shop")
    ray_toolkit.run(basic.make_app(), name=other, route_prefix="/page-other")
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    try:
        page.goto(f"{ray_toolkit.url}/-/dashboard")
        wait_for(lambda: len(_running(page, shop)) == 2 and len(_running(page, other)) == 1, 20, "both apps")
        assert page.locator("#connection").inner_text() == "live"
        assert not _overflows(page)

        # A replica killed: the page shows its replacement running within seconds.
        before = _running(page, shop)
        victim = before[0]
        actor = replica_actor(victim)
        pid = ray.get(actor.stats.remote(), timeout=30)["pid"]
        os.kill(pid, signal.SIGKILL)  # a replica this test deployed
        killed_at = time.monotonic()

        def replaced() -> bool:
            now = _running(page, shop)
            return victim not in now and len(now) == 2

        wait_for(replaced, 30, "the page to show the replacement")
        print(f"replacement on the page {time.monotonic() - killed_at:.1f} s after SIGKILL")
        assert "replacing it" in page.locator("#events").inner_text()

        # Load makes the request-rate chart move.
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=ray_toolkit.url, timeout=10) as client:
                for i in range(3000):
                    if stop.is_set():
                        return
                    client.get(f"/page-shop/items/{i}")
                    time.sleep(0.005)

        loader = threading.Thread(target=load)
        loader.start()
        try:
            card = page.locator(f'.route[data-app="{shop}"]')
            wait_for(
                lambda: card.count() == 1 and float(card.get_attribute("data-rate") or 0) > 5, 20, "a rate"
            )
            first = _chart(page, shop)
            wait_for(lambda: _chart(page, shop) != first, 10, "the chart to move")
            assert "req/s" in card.inner_text()
            page.screenshot(path=str(tmp_path / "dashboard.png"))
            if os.environ.get(SCREENSHOT_ENV):
                page.screenshot(path=os.environ[SCREENSHOT_ENV])
            page.set_viewport_size({"width": 390, "height": 844})  # a phone
            time.sleep(1.5)
            assert not _overflows(page)
            assert page.locator(f'article[data-app="{shop}"] h3').is_visible()
        finally:
            stop.set()
            loader.join(timeout=30)
        assert errors == []
    finally:
        page.close()


def test_the_docs_pages_render_with_no_internet(browser: Browser, ray_toolkit: Toolkit) -> None:
    """Swagger UI and ReDoc draw the app's API from files the app serves: every request
    that leaves 127.0.0.1 is refused, as on a machine with no internet. (ReDoc's own
    "by Redocly" logo is the one thing fetched from elsewhere: an image, not needed.)"""
    ray_toolkit.run(basic.make_app(), route_prefix="/offline")
    page = browser.new_page()
    elsewhere: list[str] = []

    def loopback_only(route: Route) -> None:
        if route.request.url.startswith(ray_toolkit.url):
            route.continue_()
        else:
            if route.request.resource_type != "image":
                elsewhere.append(route.request.url)
            route.abort()

    try:
        page.route("**/*", loopback_only)
        page.goto(f"{ray_toolkit.url}/offline/docs")
        # Swagger UI rendered the app's title and an operation of its schema.
        page.locator(".swagger-ui .info .title").wait_for(state="visible", timeout=20_000)
        page.locator(".opblock-summary-path", has_text="/items/{item_id}").first.wait_for(
            state="visible", timeout=20_000
        )
        page.goto(f"{ray_toolkit.url}/offline/redoc")
        page.get_by_text("/items/{item_id}").first.wait_for(state="attached", timeout=20_000)
    finally:
        page.close()
    assert elsewhere == []
