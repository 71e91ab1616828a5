"""The CLI's message for a Ray cluster it cannot join says the way out of the usual cause."""

from __future__ import annotations

import pytest

from app_toolkit.cli.session import no_cluster

REFUSED = ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379")


def test_an_explicit_address_without_an_auth_mode_gets_the_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    message = str(no_cluster("10.0.0.5:6379", REFUSED))
    assert message.startswith("No Ray cluster at '10.0.0.5:6379' (Failed to connect")
    assert "set RAY_AUTH_MODE=token" in message


@pytest.mark.parametrize(("address", "mode"), [("auto", None), ("10.0.0.5:6379", "token")])
def test_no_auth_hint_where_ray_would_use_the_token_already(
    monkeypatch: pytest.MonkeyPatch, address: str, mode: str | None
) -> None:
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    message = str(no_cluster(address, REFUSED))
    assert "RAY_AUTH_MODE" not in message
    assert message.endswith("start one with `ray start --head` or pass --address")
