"""Debian's headless Chromium for the page tests, driven by Playwright (which downloads no
browser: ``executable_path`` points at the system's)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Browser, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # no connections to the (closed) internet
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium(trusted_spki: str = "") -> Iterator[Browser]:
    """Headless Chromium; ``trusted_spki``: the base64 SHA-256 of a test certificate's
    public key, which the browser then trusts (and no other certificate it would not)."""
    args = (
        [*CHROMIUM_ARGS, f"--ignore-certificate-errors-spki-list={trusted_spki}"]
        if trusted_spki
        else CHROMIUM_ARGS
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield browser
        finally:
            browser.close()
