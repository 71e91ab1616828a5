"""Per-key limits and usage: requests and tokens per minute, and what each key has used.

Limits are GCRA (generic cell rate algorithm) buckets of a minute's allowance: a key may
burst up to its per-minute limit, then is let in again as the allowance refills. Requests
are counted when admitted; tokens when a reply ends (however it ends: finished, stopped
or abandoned), so a key over its token budget is refused its next requests until the
debt has refilled. The ledger is kept in this process (``accounts_store=memory``: the
``Accounts`` deployment then runs one replica, so every ingress replica shares it) or in
Redis (two replicas; one Lua script per call, timed by Redis's own clock, so every
replica agrees).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import app_toolkit as tk
from app_toolkit.llm import OpenAIError

from .settings import Settings

WINDOW_MS = 60_000.0  # the allowance refills over a minute
USAGE_FIELDS = ("requests", "prompt_tokens", "completion_tokens")


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused: ``kind`` ("requests" or "tokens") and when to retry."""

    kind: str
    retry_after_s: float


class Ledger(ABC):
    """Where the buckets and usage counts of every key are kept."""

    def __init__(self, requests_per_min: int, tokens_per_min: int) -> None:
        self.requests_per_min = requests_per_min
        self.tokens_per_min = tokens_per_min
        # Milliseconds of allowance a request / a token takes (0: unlimited).
        self.request_ms = WINDOW_MS / requests_per_min if requests_per_min else 0.0
        self.token_ms = WINDOW_MS / tokens_per_min if tokens_per_min else 0.0

    @abstractmethod
    async def admit(self, owner: str) -> Refusal | None:
        """Count one request of ``owner``, or say why it is refused (nothing counted)."""

    @abstractmethod
    async def spend(self, owner: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Count tokens ``owner`` used."""

    @abstractmethod
    async def usage(self, owner: str) -> dict[str, int]:
        """``owner``'s counts: requests, prompt_tokens, completion_tokens."""

    async def aclose(self) -> None:  # noqa: B027 - the memory ledger holds nothing open
        """Let go of connections."""


class MemoryLedger(Ledger):
    """Buckets in this process, timed by its monotonic clock."""

    def __init__(self, requests_per_min: int, tokens_per_min: int) -> None:
        super().__init__(requests_per_min, tokens_per_min)
        self._accounts: dict[str, dict[str, float]] = {}

    def _account(self, owner: str) -> dict[str, float]:
        account = self._accounts.get(owner)
        if account is None:  # owners are the configured keys' few: bounded
            account = self._accounts[owner] = dict.fromkeys(("tat_r", "tat_t", *USAGE_FIELDS), 0.0)
        return account

    async def admit(self, owner: str) -> Refusal | None:
        account, now = self._account(owner), time.monotonic() * 1000
        if self.token_ms and account["tat_t"] - now > WINDOW_MS:
            return Refusal("tokens", (account["tat_t"] - now - WINDOW_MS) / 1000)
        if self.request_ms:
            tat = max(account["tat_r"], now) + self.request_ms
            if tat - now > WINDOW_MS:
                return Refusal("requests", (tat - now - WINDOW_MS) / 1000)
            account["tat_r"] = tat
        account["requests"] += 1
        return None

    async def spend(self, owner: str, prompt_tokens: int, completion_tokens: int) -> None:
        account, now = self._account(owner), time.monotonic() * 1000
        if self.token_ms:
            account["tat_t"] = (
                max(account["tat_t"], now) + (prompt_tokens + completion_tokens) * self.token_ms
            )
        account["prompt_tokens"] += prompt_tokens
        account["completion_tokens"] += completion_tokens

    async def usage(self, owner: str) -> dict[str, int]:
        account = self._account(owner)
        return {name: int(account[name]) for name in USAGE_FIELDS}


_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
"""
_ADMIT = (
    _NOW
    + """
local request_ms, token_ms, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if token_ms > 0 then
  local tat = tonumber(redis.call('HGET', KEYS[1], 'tat_t') or '0')
  if tat - now > window then return {'tokens', tostring(tat - now - window)} end
end
if request_ms > 0 then
  local tat = math.max(tonumber(redis.call('HGET', KEYS[1], 'tat_r') or '0'), now) + request_ms
  if tat - now > window then return {'requests', tostring(tat - now - window)} end
  redis.call('HSET', KEYS[1], 'tat_r', tostring(tat))
end
redis.call('HINCRBY', KEYS[1], 'requests', 1)
return {'', '0'}
"""
)
_SPEND = (
    _NOW
    + """
local token_ms, prompt, completion = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if token_ms > 0 then
  local tat = math.max(tonumber(redis.call('HGET', KEYS[1], 'tat_t') or '0'), now)
  redis.call('HSET', KEYS[1], 'tat_t', tostring(tat + (prompt + completion) * token_ms))
end
redis.call('HINCRBY', KEYS[1], 'prompt_tokens', prompt)
redis.call('HINCRBY', KEYS[1], 'completion_tokens', completion)
return 1
"""
)


class RedisLedger(Ledger):
    """Buckets in Redis hashes (``{prefix}{owner}``), shared by every replica."""

    def __init__(self, url: str, requests_per_min: int, tokens_per_min: int, prefix: str) -> None:
        super().__init__(requests_per_min, tokens_per_min)
        self.url = url
        self.prefix = prefix
        self._client: Any = None
        self._scripts: dict[str, Any] = {}

    def _redis(self) -> Any:
        if self._client is None:
            import redis.asyncio as aioredis

            self._client = aioredis.Redis.from_url(
                self.url, decode_responses=True, socket_connect_timeout=5.0, socket_timeout=5.0
            )
            self._scripts = {
                "admit": self._client.register_script(_ADMIT),
                "spend": self._client.register_script(_SPEND),
            }
        return self._client

    async def admit(self, owner: str) -> Refusal | None:
        self._redis()
        args = [self.request_ms, self.token_ms, WINDOW_MS]
        kind, retry_ms = await self._scripts["admit"](keys=[self.prefix + owner], args=args)
        return Refusal(kind, float(retry_ms) / 1000) if kind else None

    async def spend(self, owner: str, prompt_tokens: int, completion_tokens: int) -> None:
        self._redis()
        args = [self.token_ms, prompt_tokens, completion_tokens]
        await self._scripts["spend"](keys=[self.prefix + owner], args=args)

    async def usage(self, owner: str) -> dict[str, int]:
        counts = await self._redis().hmget(self.prefix + owner, list(USAGE_FIELDS))
        return {name: int(count or 0) for name, count in zip(USAGE_FIELDS, counts, strict=True)}

    async def aclose(self) -> None:
        client, self._client, self._scripts = self._client, None, {}
        if client is not None:
            await client.aclose()


def make_ledger(settings: Settings) -> Ledger:
    if settings.accounts_store == "redis":
        url = settings.redis_url.get_secret_value()
        return RedisLedger(url, settings.requests_per_min, settings.tokens_per_min, "chat:accounts:")
    return MemoryLedger(settings.requests_per_min, settings.tokens_per_min)


@tk.deployment(max_ongoing_requests=1000, ray_actor_options={"num_cpus": 0})
class Accounts:
    """Admits requests under each key's limits and counts its usage."""

    def __init__(self, settings: Settings) -> None:
        self._ledger = make_ledger(settings)
        self._limits = {"requests": settings.requests_per_min, "tokens": settings.tokens_per_min}

    async def admit(self, owner: str) -> None:
        """Raises the 429 :class:`OpenAIError` (OpenAI's ``rate_limit_exceeded``) when
        ``owner`` is over its requests or tokens per minute."""
        refused = await self._ledger.admit(owner)
        if refused is None:
            return
        wait = max(refused.retry_after_s, 0.001)
        raise OpenAIError(
            429,
            f"Rate limit reached for {owner} on {refused.kind} per min: limit "
            f"{self._limits[refused.kind]}. Please try again in {wait:.1f}s.",
            refused.kind,
            "rate_limit_exceeded",
            retry_after=wait,
        )

    async def spend(self, owner: str, prompt_tokens: int, completion_tokens: int) -> None:
        await self._ledger.spend(owner, prompt_tokens, completion_tokens)

    async def usage(self, owner: str) -> dict[str, object]:
        counts = await self._ledger.usage(owner)
        limits = {f"{kind}_per_min": limit or None for kind, limit in self._limits.items()}
        return {"object": "usage", "owner": owner, **counts, "limits": limits}

    async def __del__(self) -> None:
        """The replica stops (awaited by the toolkit, as by Ray Serve): close connections."""
        await self._ledger.aclose()
