"""The CLI's message for a Ray cluster it cannot join says the way out of the usual cause."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from app_toolkit import api
from app_toolkit.cli import main, session
from app_toolkit.cli.session import no_cluster
from app_toolkit.exceptions import ConfigError

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


def test_run_that_cannot_join_its_address_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)

    def refused(**_: object) -> None:
        raise REFUSED  # what ray.init raises for a cluster it cannot join

    monkeypatch.setattr(api, "start", refused)
    result = CliRunner().invoke(main, ["run", "examples.demo:app", "--address", "10.0.0.5:6379"])
    assert result.exit_code == 1, result.output
    assert "Error: No Ray cluster at '10.0.0.5:6379'" in result.output
    assert "set RAY_AUTH_MODE=token" in result.output
    assert "Traceback" not in result.output


def test_a_cluster_of_another_ray_keeps_its_own_message(monkeypatch: pytest.MonkeyPatch) -> None:
    skew = ConfigError("The Ray cluster at '10.0.0.5:6379' runs Ray 2.52.0 on Python 3.11.7; ...")

    class Skewed:
        def find(self, address: str) -> None:
            raise skew

    monkeypatch.setattr(session, "session_factory", lambda backend: Skewed())
    result = CliRunner().invoke(main, ["status", "--address", "10.0.0.5:6379"])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {skew}"
