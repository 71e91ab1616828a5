"""One front's share of its API keys' limits: requests per window, tokens per window and
concurrent requests.

A request whose key has limits is admitted from what this front holds of them: requests
of the key's current window granted by the cluster's ledger (``_runtime/quotas.py``,
held by the controller), and slots of its concurrent requests. When they run out the
front asks the ledger for more, one ask per key at a time whatever the number of
requests waiting for it; the next ask is larger when the last grant went fast, so a busy
key costs the controller a few asks a second, not one per request. Slots go back to the
ledger as requests end, and the holding is renewed while it lasts. A key with a tokens
limit is admitted while its window's tokens, as the ledger told them no more than
:data:`TOKENS_FRESH_S` ago, are under the limit (the tokens are charged where replies
end).

A request over a limit gets 429 in OpenAI's shape with ``Retry-After`` and OpenAI's
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers. A key without limits
costs nothing here. When the controller does not answer within :data:`ASK_TIMEOUT_S`,
the front keeps a ledger of its own until it does (logged once; no token is charged to
it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass

from app_toolkit import metrics
from app_toolkit._runtime.answers import json_answer
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit._runtime.quotas import LEASE_S, QuotaAsk, QuotaGrant, QuotaLedger, TakeQuota
from app_toolkit.config.api_keys import APIKey

logger = logging.getLogger("app_toolkit.proxy")

#: How long an ask may take before the front counts the controller as unreachable.
ASK_TIMEOUT_S = 2.0
#: The most requests one ask takes of a window.
_MOST_PER_ASK = 1024
#: How old a key's token count may be before a request of the key asks for it again (the
#: requests of the key that come meanwhile wait for the same answer).
TOKENS_FRESH_S = 0.5
#: After the ledger refused a key's slot, how long its requests over the limit are refused
#: without asking again.
_SLOTS_RETRY_S = 0.05
#: A grant spent faster than this makes the next ask twice as large; slower, half.
_FAST_S = 0.1
_SLOW_S = 1.0

LIMITED = metrics.Counter(
    "app_toolkit_api_key_rate_limited_total",
    "Requests refused with 429 for their API key's limits, by key name and limit "
    "(requests: per window; concurrent: at once).",
    ("key", "limit"),
)


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


@dataclass(slots=True)
class _KeyState:
    limits: Limits
    allowance: int = 0  # requests granted of the window, not used yet
    window_ends: float = 0.0  # monotonic
    remaining: int = -1  # the ledger's count left in the window after the last grant
    in_use: int = 0  # requests of the key in progress here
    slots: int = 0  # slots held
    waiting: int = 0  # requests waiting for an ask
    batch: int = 1  # how many requests the next ask takes
    granted_at: float = 0.0
    slots_refused_until: float = 0.0  # monotonic
    tokens_used: int = 0  # the window's tokens, as the ledger last told
    tokens_heard: float = 0.0  # when it told (monotonic; 0: never)
    asking: asyncio.Task[None] | None = None


class KeyLimits:
    """The limits of the keys this front admits. ``take``: the ledger's (None: this
    front's own, as when the controller cannot be reached)."""

    def __init__(self, take: TakeQuota | None) -> None:
        self._id = uuid.uuid4().hex
        self._take = take
        self._own = QuotaLedger(time.time)
        self._keys: dict[str, _KeyState] = {}
        self._renewing: asyncio.Task[None] | None = None
        self._unreachable = False

    async def enter(self, limits: Limits, request_id: str) -> HTTPResponse | None:
        """Admit one request of ``limits``' key (None; the caller must :meth:`leave` once
        it ends), or the 429 it gets."""
        state = self._keys.get(limits.key)
        if state is None:
            state = self._keys[limits.key] = _KeyState(limits)
        elif state.limits is not limits:  # the keys were read again: maybe new limits
            if state.limits.window_s != limits.window_s:
                state.allowance = 0
            state.limits = limits
        if self._admit(state):
            return None
        if not self._spent(state):
            state.waiting += 1
            try:
                for _ in range(2):
                    asking, joined = state.asking, state.asking is not None
                    if asking is None:
                        asking = state.asking = asyncio.get_running_loop().create_task(self._ask(state))
                    await asyncio.shield(asking)
                    if self._admit(state):
                        return None
                    # An ask that was out before this request came did not count it: one more.
                    if not joined or self._spent(state):
                        break
            finally:
                state.waiting -= 1
        return self._refusal(state, request_id)

    def leave(self, limits: Limits) -> None:
        """A request :meth:`enter` admitted has ended."""
        state = self._keys.get(limits.key)
        if state is None or not limits.concurrent:
            return
        state.in_use = max(0, state.in_use - 1)
        state.slots_refused_until = 0.0  # a slot is free here: the next request may have it
        if state.slots > state.in_use + state.waiting and state.asking is None:
            state.asking = asyncio.get_running_loop().create_task(self._ask(state))

    def close(self) -> None:
        """The front stops: no more renewals (the ledger's leases end on their own)."""
        for task in (self._renewing, *(state.asking for state in self._keys.values())):
            if task is not None:
                task.cancel()

    def _admit(self, state: _KeyState) -> bool:
        limits = state.limits
        now = time.monotonic()
        if limits.requests:
            if now >= state.window_ends:
                state.allowance = 0
            if state.allowance <= 0:
                return False
        if limits.tokens and (
            now - state.tokens_heard > TOKENS_FRESH_S
            or now >= state.window_ends
            or state.tokens_used >= limits.tokens
        ):
            return False
        if limits.concurrent and state.in_use >= state.slots:
            return False
        if limits.requests:
            state.allowance -= 1
        if limits.concurrent:
            state.in_use += 1
        return True

    @staticmethod
    def _spent(state: _KeyState) -> bool:
        """The ledger said no more very lately: the key's window has nothing left (until
        it ends), or its slots are all held (in the last :data:`_SLOTS_RETRY_S`). A request
        over a limit is refused without an ask, so a flood of them costs the controller
        nothing."""
        now = time.monotonic()
        limits = state.limits
        if limits.requests and state.allowance <= 0 and state.remaining == 0 and now < state.window_ends:
            return True
        if limits.tokens and state.tokens_used >= limits.tokens and now < state.window_ends:
            return True  # a window's tokens only grow
        return bool(limits.concurrent) and state.in_use >= state.slots and now < state.slots_refused_until

    def _want(self, state: _KeyState, now: float) -> int:
        """How many requests of the window to ask for: those waiting, or the batch (grown
        when the last grant went fast), no more than a quarter of what the window has left
        (other fronts share it)."""
        limits = state.limits
        if not limits.requests or (state.allowance > 0 and now < state.window_ends):
            return 0
        spent_in = now - state.granted_at
        if spent_in < _FAST_S:
            state.batch = min(state.batch * 2, _MOST_PER_ASK)
        elif spent_in > _SLOW_S:
            state.batch = max(state.batch // 2, 1)
        left = state.remaining if state.remaining >= 0 and now < state.window_ends else limits.requests
        return max(state.waiting, min(state.batch, max(1, left // 4)))

    async def _ask(self, state: _KeyState) -> None:
        """Ask the ledger for what ``state``'s waiting requests need, and give back slots
        no longer used, until what the front holds is what it uses (or the ledger has no
        more to give)."""
        try:
            for _ in range(8):
                now = time.monotonic()
                limits = state.limits
                slots = state.in_use + state.waiting if limits.concurrent else 0
                # Slots on their way back are not used meanwhile.
                state.slots = min(state.slots, slots)
                want = self._want(state, now)
                ask = QuotaAsk(
                    limits.key,
                    limits.window_s,
                    limits.requests,
                    want,
                    limits.concurrent,
                    slots,
                    limits.tokens,
                )
                (grant,) = await self._send((ask,))
                self._apply(state, grant, now, slots)
                if not limits.concurrent or grant.slots < slots:
                    break
                if state.slots == state.in_use + state.waiting:
                    break
        finally:
            state.asking = None

    async def _send(self, asks: tuple[QuotaAsk, ...]) -> tuple[QuotaGrant, ...]:
        if self._take is not None:
            try:
                grants = await asyncio.wait_for(self._take(self._id, asks, ()), ASK_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - any failure: the front's own ledger
                if not self._unreachable:
                    self._unreachable = True
                    logger.warning(
                        "API key limits: the controller did not answer (%s); this front keeps them on "
                        "its own until it does",
                        type(exc).__name__,
                    )
            else:
                if self._unreachable:
                    self._unreachable = False
                    logger.info("API key limits: the controller answers again")
                return grants
        return self._own.take(self._id, asks)

    def _apply(self, state: _KeyState, grant: QuotaGrant, asked_at: float, wanted_slots: int) -> None:
        now = time.monotonic()
        limits = state.limits
        if limits.requests or limits.tokens:
            window_ends = asked_at + grant.reset_in_s
            if window_ends > state.window_ends + 0.5 * limits.window_s:
                state.allowance = 0  # a new window: what was left of the last is gone
            state.window_ends = window_ends
        if limits.requests:
            state.allowance += grant.requests
            state.remaining = grant.remaining
            if grant.requests:
                state.granted_at = now
        if limits.tokens:
            state.tokens_used, state.tokens_heard = grant.tokens_used, now
        if state.limits.concurrent:
            if grant.slots < wanted_slots:
                state.slots_refused_until = now + _SLOTS_RETRY_S
            state.slots = grant.slots
            if state.slots and self._renewing is None:
                self._renewing = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        """Renew the holdings of slots while there are any."""
        try:
            while True:
                await asyncio.sleep(LEASE_S / 3)
                held = [state for state in self._keys.values() if state.slots and state.asking is None]
                if not held:
                    if not any(state.slots for state in self._keys.values()):
                        return
                    continue
                for state in held:
                    state.slots = min(state.slots, state.in_use + state.waiting)
                asks = tuple(
                    QuotaAsk(s.limits.key, s.limits.window_s, 0, 0, s.limits.concurrent, s.slots)
                    for s in held
                )
                for state, grant in zip(held, await self._send(asks), strict=True):
                    state.slots = grant.slots
        finally:
            self._renewing = None

    def _refusal(self, state: _KeyState, request_id: str) -> HTTPResponse:
        limits = state.limits
        now = time.monotonic()
        reset_s = max(0.0, state.window_ends - now)
        over_requests = bool(limits.requests) and (state.allowance <= 0 or now >= state.window_ends)
        over_tokens = not over_requests and bool(limits.tokens) and state.tokens_used >= limits.tokens
        which = "requests" if over_requests else "tokens" if over_tokens else "concurrent"
        LIMITED.inc(limits.key, which)
        headers: list[tuple[bytes, bytes]] = []
        if limits.requests:
            left = 0 if over_requests else max(0, state.remaining) + max(0, state.allowance)
            headers += _rate_headers(b"requests", limits.requests, left, reset_s)
        if limits.tokens:
            headers += _rate_headers(
                b"tokens", limits.tokens, max(0, limits.tokens - state.tokens_used), reset_s
            )
        if which == "concurrent":
            retry_after = 1
            message = (
                f"Too many concurrent requests: at most {limits.concurrent} at once for API key "
                f"{limits.key!r}. Try again when one has ended."
            )
        else:
            retry_after = max(1, math.ceil(reset_s))
            limit = limits.requests if over_requests else limits.tokens
            message = (
                f"Rate limit reached for {which}: {limit} per {limits.window_s:g} s for API key "
                f"{limits.key!r}. Try again in {retry_after} s."
            )
        headers.append((b"retry-after", str(retry_after).encode()))
        kind = "tokens" if over_tokens else "requests"
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
