"""The chat example on Ray behind the toolkit's API keys (``chat_keys_scenario.py``, on a
cluster of its own: its proxy asks for keys)."""

from __future__ import annotations

from tests.conftest import free_port
from tests.scenario import run_scenario


def test_the_chat_behind_the_toolkits_keys_limits_and_page_sign_in_on_ray() -> None:
    seen = run_scenario("tests.integration.chat_keys_scenario", str(free_port()), timeout_s=300)
    assert seen["ingress_replicas"] == 2
    assert seen["no_key"] == [401, "invalid_api_key"]
    # Four of alice's window, over both ingress replicas; the fifth refused with the headers.
    assert seen["alice"] == [200, 200, 200, 200, 429]
    assert seen["alice_429"] == ["rate_limit_exceeded", "4"]
    # bob's reply is charged its tokens (3 prompt, 3 completion), in both counts.
    assert seen["bob_tokens"] == 6 and seen["bob_chat_tokens"] == 3
    assert seen["llm_metrics"] == [True, True]
    # The page signs in with a key and its requests are that key's.
    assert seen["page_signed_out"] == 401
    assert seen["page_sign_in"] == [204, True]
    assert seen["page_session"] == {"keys": True, "owner": "bob"}
    assert seen["page_reply"] == ["event: token", "event: token", "event: done"]
    # In Chromium: carol's three requests are the sign-in and two messages (reading a
    # reply counts nothing more); the third message waits out the limit.
    assert seen["page_keeps_no_key"] is True
    assert seen["page_answered"] == 2 and seen["page_waits"] is True
    # An app without direct ingress lets a request in as the key its route names, under
    # the key's limits and with its class.
    assert seen["by_name"] == [200, {"key": "dave", "priority": -2}, 429, 401]
