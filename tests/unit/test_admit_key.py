"""``admit_key`` (``front/key_door.py``) with a real key ring and limits (the front's own
ledger), and ``charge_tokens`` by a key's name."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from starlette.requests import Request

import app_toolkit as tk
from app_toolkit._runtime import request_context, token_charges
from app_toolkit._runtime.front import key_door
from app_toolkit._runtime.front.key_check import KeyRing
from app_toolkit._runtime.front.key_door import KeyDoor
from app_toolkit._runtime.front.key_limits import KeyLimits
from app_toolkit._runtime.front.scope import API_KEY_NAME
from app_toolkit._runtime.quotas import Charges, QuotaAsk, QuotaGrant, QuotaLedger
from app_toolkit.config import HTTPOptions
from app_toolkit.config.api_keys import key_hash, new_key

KEYS = [
    {"name": "single", "hash": key_hash(new_key()), "max_concurrent_requests": 1, "priority": -1},
    {"name": "free", "hash": key_hash(new_key())},
    {
        "name": "socket",
        "hash": key_hash(new_key()),
        "max_concurrent_requests": 1,
        "requests_per_window": 3,
        "window_s": 3600,
    },
]


@pytest.fixture
def door(monkeypatch: pytest.MonkeyPatch) -> KeyDoor:
    installed = KeyDoor(KeyRing(HTTPOptions(api_keys=KEYS)), KeyLimits(None))
    monkeypatch.setattr(key_door, "_installed", installed)
    return installed


def _request() -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""})


async def _refused(scope: dict[str, Any], name: str | None) -> int:
    with pytest.raises(tk.APIKeyRefused) as refused:
        await key_door.admit(scope, name)
    assert API_KEY_NAME not in scope  # nothing of the key stays: asking again is refused again
    return refused.value.status_code


def test_a_request_is_let_in_once_and_its_slot_comes_back_as_its_scope_ends(door: KeyDoor) -> None:
    async def body() -> None:
        first: dict[str, Any] = {}
        with request_context.request_scope("first"):
            assert await key_door.admit(first, "single")
            assert first[API_KEY_NAME] == "single" and request_context.current_share() is not None
            assert await key_door.admit(first, "free")  # let in already: the same key's
            with request_context.request_scope("second"):
                second: dict[str, Any] = {}
                assert await _refused(second, "single") == 429  # the one slot is the first's
                assert await _refused(second, "single") == 429
        with request_context.request_scope("third"):
            assert await key_door.admit({}, "single")  # the first's slot came back

    asyncio.run(body())


def test_no_key_an_unknown_one_and_a_failed_ask_let_nothing_in(
    door: KeyDoor, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing(*args: object) -> None:
        raise RuntimeError("the ledger failed")

    async def body() -> None:
        with request_context.request_scope("r"):
            assert await _refused({}, None) == 401
            assert await _refused({}, "nobody") == 401
            scope: dict[str, Any] = {}
            with monkeypatch.context() as patched:
                patched.setattr(door.limits, "enter", failing)
                with pytest.raises(RuntimeError, match="ledger failed"):
                    await key_door.admit(scope, "single")
            assert scope == {}
            assert await key_door.admit(scope, "single")  # (then counted once, when let in)

    asyncio.run(body())


def test_a_sockets_messages_count_as_requests_without_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = QuotaLedger(time.time)
    asked: list[QuotaAsk] = []

    async def take(front: str, asks: tuple[QuotaAsk, ...], charges: Charges) -> tuple[QuotaGrant, ...]:
        asked.extend(asks)
        return ledger.take(front, asks, charges)

    door = KeyDoor(KeyRing(HTTPOptions(api_keys=KEYS)), KeyLimits(take))
    monkeypatch.setattr(key_door, "_installed", door)

    async def body() -> None:
        socket: dict[str, Any] = {}
        with request_context.request_scope("socket"):
            assert await key_door.admit(socket, "socket")  # the socket: one request, the slot
            await key_door.count(socket)  # two (the slot is the socket's: none taken)
            await key_door.count(socket)  # three
            with pytest.raises(tk.APIKeyRefused) as refused:
                await key_door.count(socket)
            assert refused.value.status_code == 429 and refused.value.error["type"] == "requests"
            await key_door.count({})  # a connection without a key: nothing counted
            await key_door.count({API_KEY_NAME: "free"})  # a key without limits: nothing
            with pytest.raises(tk.APIKeyRefused) as revoked:
                await key_door.count({API_KEY_NAME: "gone"})
            assert revoked.value.status_code == 401
        door.limits.close()
        assert asked and all(ask.slots <= 1 for ask in asked)  # the socket's one slot, never more

    asyncio.run(body())


def test_admit_key_outside_a_request_says_where_it_works(door: KeyDoor) -> None:
    with pytest.raises(RuntimeError, match="serving the request"):
        asyncio.run(key_door.admit({}, "free"))


def test_with_keys_off_admit_key_lets_everyone_in_and_counts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(key_door, "_installed", None)
    assert asyncio.run(tk.admit_key(_request(), "alice")) is False
    assert asyncio.run(tk.admit_key(_request(), None)) is False


def _charged(key: str) -> float:
    value = dict(token_charges.TOKENS._samples()).get((key,), 0.0)
    assert isinstance(value, float)
    return value


def test_tokens_are_charged_by_a_keys_name_and_never_to_no_key() -> None:
    before = _charged("unit-bob")
    tk.charge_tokens("unit-bob", 7)
    tk.charge_tokens("", 7)  # no key
    tk.charge_tokens(_request(), 7)  # a request without a key
    assert _charged("unit-bob") == before + 7
    assert _charged("") == 0
    with pytest.raises(ValueError, match="whole number"):
        tk.charge_tokens("unit-bob", -1)
