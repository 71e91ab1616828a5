"""The API key check's pure parts (docs/security.md): the same work for every key, keys
that fail at start, and ``app-toolkit keys new``. The front serving with keys:
tests/integration/test_api_keys.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from app_toolkit._runtime.front import key_check
from app_toolkit._runtime.front.scope import read_headers
from app_toolkit.cli import main
from app_toolkit.config import HTTPOptions, api_keys, parse_http_options
from app_toolkit.config.api_keys import APIKey, key_hash, new_key
from app_toolkit.exceptions import ConfigError

ALICE = new_key()
BOB = new_key()


def test_the_check_does_the_same_work_whatever_is_presented(monkeypatch: pytest.MonkeyPatch) -> None:
    ring = key_check.KeyRing(HTTPOptions(api_keys=(APIKey(name="alice", hash=key_hash(ALICE)),)))
    hashed: list[bytes] = []
    real = api_keys.digest_of

    def counted(key: bytes) -> bytes:
        hashed.append(key)
        return real(key)

    monkeypatch.setattr(api_keys, "digest_of", counted)
    presented = {
        "right": [(b"authorization", f"Bearer {ALICE}".encode())],
        "wrong": [(b"authorization", f"Bearer {BOB}".encode())],
        "malformed": [(b"authorization", f"Token {ALICE}".encode())],
        "none": [],
    }
    names = {what: ring.holder(read_headers({"headers": headers})) for what, headers in presented.items()}
    assert names == {"right": "alice", "wrong": None, "malformed": None, "none": None}
    assert len(hashed) == len(presented)  # one hash and one lookup each, whatever came


def test_bad_keys_fail_at_start_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Cannot read the API keys file .*keys.yaml"):
        parse_http_options({"api_keys_file": str(tmp_path / "keys.yaml")})
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {name: a, hash: 'sha256:12'}\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        parse_http_options({"api_keys_file": str(bad)})
    twice = {"name": "a", "hash": key_hash(ALICE)}
    with pytest.raises(ConfigError, match="same name"):
        parse_http_options({"api_keys": [twice, {**twice, "hash": key_hash(BOB)}]})


def test_keys_new_prints_the_key_once_and_the_entry_that_opens_with_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["keys", "new", "carol", "--expires", "2099-01-31"])
    assert result.exit_code == 0, result.output
    key = result.output.splitlines()[1].strip()
    entry = result.output.splitlines()[3].strip()
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(entry + "\n")
    ring = key_check.KeyRing(HTTPOptions(api_keys_file=str(keys_file)))
    assert ring.holder(read_headers({"headers": [(b"x-api-key", key.encode())]})) == "carol"
    assert key not in entry
    assert CliRunner().invoke(main, ["keys", "new", "no spaces"]).exit_code == 2
