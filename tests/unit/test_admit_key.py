"""``admit_key`` and ``charge_tokens`` by a key's name, where no front runs with keys on."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

import app_toolkit as tk
from app_toolkit._runtime import token_charges
from app_toolkit._runtime.front import key_door


def _request() -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""})


def _charged(key: str) -> float:
    value = dict(token_charges.TOKENS._samples()).get((key,), 0.0)
    assert isinstance(value, float)
    return value


def test_with_keys_off_admit_key_lets_everyone_in_and_counts_nothing() -> None:
    assert key_door.installed() is None
    assert asyncio.run(tk.admit_key(_request(), "alice")) is False
    assert asyncio.run(tk.admit_key(_request(), None)) is False


def test_tokens_are_charged_by_a_keys_name_and_never_to_no_key() -> None:
    before = _charged("unit-bob")
    tk.charge_tokens("unit-bob", 7)
    tk.charge_tokens("", 7)  # no key
    tk.charge_tokens(_request(), 7)  # a request without a key
    assert _charged("unit-bob") == before + 7
    assert _charged("") == 0
    with pytest.raises(ValueError, match="whole number"):
        tk.charge_tokens("unit-bob", -1)
