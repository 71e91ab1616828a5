"""APP_TOOLKIT_OTEL_SETUP: a set-up that cannot run fails with what to fix; without a
provider the toolkit makes no spans. (Spans themselves: tests/integration/test_otel.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app_toolkit._runtime import tracing
from app_toolkit.exceptions import ConfigError

NOT_A_FUNCTION = 42


def sets_nothing() -> None:
    pass


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setitem(tracing._state, "setup_done", False)
    yield monkeypatch


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_module_here:setup", 'Could not import module "no_such_module_here"'),
        ("tests.unit.test_otel:missing", 'has no attribute "missing"'),
        ("tests.unit.test_otel:NOT_A_FUNCTION", "must name a function that sets a tracer provider"),
        ("no colon", 'must look like "module:attribute" or "module.attribute"'),
    ],
)
def test_a_bad_setup_fails_fast_with_what_to_fix(fresh: pytest.MonkeyPatch, path: str, message: str) -> None:
    fresh.setenv(tracing.SETUP_ENV, path)
    with pytest.raises(ConfigError, match=message):
        tracing.setup_from_env()


@pytest.mark.parametrize("path", ["tests.unit.test_otel:sets_nothing", "tests.unit.test_otel.sets_nothing"])
def test_a_setup_that_sets_no_provider_is_reported(
    fresh: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    fresh.setenv(tracing.SETUP_ENV, path)
    tracing.setup_from_env()
    assert "set no tracer provider" in caplog.text
    assert tracing.start("x", "client", None) is None
    tracing.setup_from_env()  # once per process
    assert caplog.text.count("set no tracer provider") == 1
