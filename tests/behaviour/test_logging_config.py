"""Per-application and per-deployment ``logging_config``, on both backends."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest

from app_toolkit._runtime import log_format
from tests.apps.logging_apps import Speaker
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for


@contextlib.contextmanager
def toolkit_console() -> Iterator[None]:
    """This process logs the toolkit's way (to the stderr capsys holds) while inside:
    the local backend's replicas run here, and their lines go through its handler."""
    toolkit = logging.getLogger("app_toolkit")
    root = logging.getLogger()
    saved = (toolkit.level, root.level)
    log_format.configure("info", "text")
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h.get_name() == "app_toolkit"]:
            root.removeHandler(handler)
        toolkit.setLevel(saved[0])
        root.setLevel(saved[1])


def test_levels_and_access_lines_follow_each_application_and_deployment(
    toolkit: Toolkit, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Quiet's application sets WARNING and no access lines; Loud's sets WARNING too, but
    Loud's own INFO wins. (On Ray the replicas' lines reach this process through Ray's log
    relay; the test session's proxies write no access lines there, so that half is local.)"""
    speaker = as_deployment(Speaker)
    caplog.set_level(logging.INFO, logger="app_toolkit.access")
    quiet, loud = toolkit.name(), toolkit.name()
    with toolkit_console():
        toolkit.run(
            speaker.options(name="Quiet").bind("quiet"),
            name=quiet,
            route_prefix=f"/{quiet}",
            logging_config={"log_level": "WARNING", "enable_access_log": False},
        )
        toolkit.run(
            speaker.options(name="Loud", logging_config={"log_level": "INFO"}).bind("loud"),
            name=loud,
            route_prefix=f"/{loud}",
            logging_config={"log_level": "WARNING"},
        )
        with toolkit.client() as client:
            assert client.get(f"/{quiet}").text == "quiet"
            assert client.get(f"/{loud}").text == "loud"
        seen: list[str] = []

        def both_warnings() -> bool:
            seen.append(capsys.readouterr().err)
            text = "".join(seen)
            return "quiet speaks at warning" in text and "loud speaks at info" in text

        wait_for(both_warnings, 30, "the replicas' lines")
    text = "".join(seen)
    # Quiet's process wrote its INFO line before its WARNING one, had it written it.
    assert "quiet speaks at info" not in text and "loud speaks at warning" in text
    if toolkit.backend == "local":

        def access() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "app_toolkit.access"]

        lines = wait_for(lambda: [line for line in access() if f"/{loud}" in line], 10, "Loud's access line")
        assert f'"GET /{loud} HTTP/1.1" 200' in lines[0]
        assert not [line for line in access() if f"/{quiet}" in line]  # its line came before Loud's
