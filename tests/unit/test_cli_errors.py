"""The CLI's message for a Ray cluster it cannot join says the way out of the usual cause."""

from __future__ import annotations

import pytest

from app_toolkit.cli.session import no_cluster

REFUSED = ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379")


@pytest.mark.parametrize(("address", "ray_address"), [("10.0.0.5:6379", None), ("auto", "10.0.0.5:6379")])
def test_an_explicit_address_without_an_auth_mode_gets_the_hint(
    monkeypatch: pytest.MonkeyPatch, address: str, ray_address: str | None
) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    if ray_address is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:  # --address auto (the default) joins RAY_ADDRESS: an explicit address to Ray too
        monkeypatch.setenv("RAY_ADDRESS", ray_address)
    message = str(no_cluster(address, REFUSED))
    where = "'10.0.0.5:6379'" if ray_address is None else "'auto' (RAY_ADDRESS='10.0.0.5:6379')"
    assert message.startswith(f"No Ray cluster at {where} (Failed to connect")
    token = "with the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN"
    assert f"set RAY_AUTH_MODE=token, {token}" in message


@pytest.mark.parametrize(
    ("address", "mode", "error"),
    [
        ("auto", None, REFUSED),  # Ray uses the token of a cluster it finds by itself
        ("10.0.0.5:6379", "token", REFUSED),  # asked for already
        ("10.0.0.5:6379", None, ValueError("Invalid address format")),  # not a refused connection
    ],
)
def test_no_auth_hint_where_it_would_not_help(
    monkeypatch: pytest.MonkeyPatch, address: str, mode: str | None, error: Exception
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    message = str(no_cluster(address, error))
    assert "RAY_AUTH_MODE" not in message
    assert message.endswith("start one with `ray start --head` or pass --address")
