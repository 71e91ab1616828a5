"""An API key's limits as a front keeps them, and the 429 a request over one gets: OpenAI's
error shape with ``Retry-After`` and OpenAI's ``x-ratelimit-{limit,remaining,reset}-*``
headers (``requests`` for a key with a requests limit, ``tokens`` for one with a tokens
limit)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from app_toolkit import metrics
from app_toolkit._runtime.answers import json_answer
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit.config.api_keys import APIKey

LIMITED = metrics.Counter(
    "app_toolkit_api_key_rate_limited_total",
    "Requests refused with 429 for their API key's limits, by key name and limit "
    "(requests or tokens: per window; concurrent: at once).",
    ("key", "limit"),
)

#: Which of a key's limits a request is over.
Over = Literal["requests", "tokens", "concurrent"]


@dataclass(frozen=True, slots=True)
class Limits:
    """One key's limits (0: none)."""

    key: str
    window_s: float
    requests: int
    concurrent: int
    tokens: int = 0

    @classmethod
    def of(cls, key: APIKey) -> Limits | None:
        if not key.limited:
            return None
        return cls(
            key.name,
            key.window_s,
            key.requests_per_window or 0,
            key.max_concurrent_requests or 0,
            key.tokens_per_window or 0,
        )


def too_many(
    limits: Limits, over: Over, requests_left: int, tokens_used: int, reset_s: float, request_id: str
) -> HTTPResponse:
    """429 for a request of ``limits``' key over its ``over`` limit; the key's window ends in
    ``reset_s`` with ``requests_left`` requests and ``tokens_used`` tokens as last heard."""
    LIMITED.inc(limits.key, over)
    headers: list[tuple[bytes, bytes]] = []
    if limits.requests:
        headers += _rate_headers(b"requests", limits.requests, requests_left, reset_s)
    if limits.tokens:
        headers += _rate_headers(b"tokens", limits.tokens, max(0, limits.tokens - tokens_used), reset_s)
    if over == "concurrent":
        retry_after = 1
        message = (
            f"Too many concurrent requests: at most {limits.concurrent} at once for API key "
            f"{limits.key!r}. Try again when one has ended."
        )
    else:
        retry_after = max(1, math.ceil(reset_s))
        limit = limits.requests if over == "requests" else limits.tokens
        message = (
            f"Rate limit reached for {over}: {limit} per {limits.window_s:g} s for API key "
            f"{limits.key!r}. Try again in {retry_after} s."
        )
    headers.append((b"retry-after", str(retry_after).encode()))
    kind = "tokens" if over == "tokens" else "requests"
    error = {"message": message, "type": kind, "param": None, "code": "rate_limit_exceeded"}
    return json_answer(429, {"error": error}, request_id, tuple(headers))


def _rate_headers(what: bytes, limit: int, remaining: int, reset_s: float) -> list[tuple[bytes, bytes]]:
    """OpenAI's ``x-ratelimit-{limit,remaining,reset}-<what>`` headers."""
    return [
        (b"x-ratelimit-limit-" + what, str(limit).encode()),
        (b"x-ratelimit-remaining-" + what, str(remaining).encode()),
        (b"x-ratelimit-reset-" + what, reset_text(reset_s).encode()),
    ]


def reset_text(seconds: float) -> str:
    """A time as OpenAI's ``x-ratelimit-reset-*`` headers give it: ``850ms``, ``12s``,
    ``6m0s``, ``1h2m3s``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
