"""A browser page on another origin may call the API once its origin is listed (CORS)."""

from __future__ import annotations

import app_toolkit as tk

from chat.app import build_app

from .conftest import ECHO, chat

ORIGIN = "https://chat.example.com"


def test_listed_origins_may_call_the_api() -> None:
    settings = ECHO.model_copy(update={"cors_origins": [ORIGIN]})
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    with tk.testing.TestClient(build_app(settings)) as client:
        allowed = client.options(
            "/v1/chat/completions",
            headers={**preflight, "Access-Control-Request-Headers": "authorization, x-stainless-os"},
        )
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == ORIGIN
        answer = client.post("/v1/chat/completions", json=chat("hi"), headers={"Origin": ORIGIN})
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == ORIGIN
        assert "x-request-id" in answer.headers["access-control-expose-headers"]
        other = client.options(
            "/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"}
        )
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
