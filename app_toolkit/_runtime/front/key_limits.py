"""One front's share of its API keys' limits: requests per window, tokens per window and
concurrent requests.

A request whose key has limits is admitted from what this front holds of them: requests
of the key's current window granted by the cluster's ledger (``_runtime/quotas.py``,
held by the controller, reached through ``ledger_link.py``), and slots of its concurrent
requests. When they run out the front asks the ledger for more: one ask per key at a time
(the only one that changes what the front holds of the key), for all the requests that
wait for it, served first come first served; the next ask takes more when the last grant
went fast, so a busy key costs the controller a few asks a second, not one per request.

Slots are kept while the key's requests come and go: an idle slot goes back after
:data:`SLOT_KEEP_S`, at once when the ledger says other fronts were refused one, and the
holding is renewed every third of its lease. A key with a tokens limit is admitted while
its window's tokens, as the ledger told them no more than :data:`TOKENS_FRESH_S` ago, are
under the limit (heard again in the background before they are that old; the tokens are
charged where replies end). A request over a limit gets the 429 of ``rate_limits.py``; a
key without limits costs nothing here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from app_toolkit._runtime.front.ledger_link import LedgerLink
from app_toolkit._runtime.front.rate_limits import Limits, Over, too_many
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit._runtime.quotas import LEASE_S, QuotaAsk, QuotaGrant, TakeQuota

logger = logging.getLogger("app_toolkit.proxy")

#: The most requests one ask takes of a window.
_MOST_PER_ASK = 1024
#: A grant spent faster than this makes the next ask twice as large; slower, half.
_FAST_S = 0.1
_SLOW_S = 1.0
#: How long a key's token count may be old before its requests wait for it to be heard
#: again (it is heard again in the background from half that age).
TOKENS_FRESH_S = 0.5
#: How long a request refused a slot waits before it asks again (another front may be
#: about to give one back).
_SLOT_RETRY_S = 0.1
#: How long a slot with no request is kept before it goes back to the ledger.
SLOT_KEEP_S = 0.1
#: How often the keeper looks at the slots held.
_KEEPER_TICK_S = 0.05
#: How many asks one request waits for before it is refused.
_ROUNDS = 4


@dataclass(slots=True)
class _KeyState:
    limits: Limits
    allowance: int = 0  # requests granted of the window, not used yet
    window_ends: float = 0.0  # monotonic
    remaining: int = -1  # the ledger's count left in the window after the last grant
    batch: int = 1  # how many requests the next ask takes
    granted_at: float = 0.0
    tokens_used: int = 0  # the window's tokens, as the ledger last told
    tokens_heard: float = 0.0  # when it told (monotonic; 0: never)
    in_use: int = 0  # requests of the key in progress here
    slots: int = 0  # slots held
    waiting: int = 0  # requests waiting for an ask
    slotless: int = 0  # of those, requests that take no slot (a WebSocket's messages)
    idle_since: float = 0.0  # since when a slot held has had no request (0: none idle)
    contended: bool = False  # the ledger refused some front a slot of the key lately
    renewed_at: float = 0.0  # when the holding was last sent to the ledger
    asking: asyncio.Task[None] | None = None

    @property
    def idle_slots(self) -> int:
        return self.slots - self.in_use - (self.waiting - self.slotless)


class KeyLimits:
    """The limits of the keys this front admits. ``take``: the controller's ledger (None:
    this front's own, as in tests without a controller)."""

    def __init__(self, take: TakeQuota | None) -> None:
        self._link = LedgerLink(take)
        self._keys: dict[str, _KeyState] = {}
        self._keeper: asyncio.Task[None] | None = None

    async def enter(self, limits: Limits, request_id: str, slot: bool = True) -> HTTPResponse | None:
        """Admit one request of ``limits``' key (None; the caller must :meth:`leave` once
        it ends), or the 429 it gets. ``slot``: it takes one of the key's concurrent
        slots (False: a message of a WebSocket that holds one; nothing to leave then)."""
        state = self._state(limits)
        now = time.monotonic()
        spent = self._spent(state, now)
        if (
            limits.tokens
            and not spent
            and state.tokens_heard
            and now - state.tokens_heard > TOKENS_FRESH_S / 2
        ):
            self._ask_soon(state)  # the count heard again before requests must wait for it
        if state.waiting == 0 and self._admit(state, now, waiting=False, slot=slot):
            return None
        if not spent:
            state.waiting += 1
            state.slotless += not slot
            try:
                for round_ in range(_ROUNDS):
                    if round_ and slot and self._slots_refused(state):
                        await asyncio.sleep(_SLOT_RETRY_S)  # another front may give one back
                    await asyncio.shield(self._ask_soon(state))
                    now = time.monotonic()
                    if self._admit(state, now, waiting=True, slot=slot):
                        return None
                    if self._spent(state, now):
                        break
            finally:
                state.waiting -= 1
                state.slotless -= not slot
                self._free(state)  # slots asked for this request (refused or gone) are not needed
        return self._refusal(state, request_id, slot)

    def leave(self, limits: Limits) -> None:
        """A request :meth:`enter` admitted has ended."""
        state = self._keys.get(limits.key)
        if state is None or not limits.concurrent:
            return
        state.in_use = max(0, state.in_use - 1)
        self._free(state)

    def close(self) -> None:
        """The front has stopped: no more asks or renewals (the leases end by themselves)."""
        self._link.close()
        for task in (self._keeper, *(state.asking for state in self._keys.values())):
            if task is not None:
                task.cancel()

    def _state(self, limits: Limits) -> _KeyState:
        state = self._keys.get(limits.key)
        if state is None:
            state = self._keys[limits.key] = _KeyState(limits)
        elif state.limits is not limits:  # the keys were read again: maybe new limits
            old = state.limits
            if old.window_s != limits.window_s:  # another count altogether: heard afresh
                state.allowance, state.window_ends, state.tokens_heard = 0, 0.0, 0.0
            if (old.requests, old.window_s) != (limits.requests, limits.window_s):
                state.remaining = -1  # (a window spent under the old limit may have room now)
            state.limits = limits
        return state

    def _admit(self, state: _KeyState, now: float, waiting: bool, slot: bool) -> bool:
        """Take one request of ``state``'s key from what the front holds, if it holds
        enough (``waiting``: the request is one of ``state.waiting``; ``slot``: it takes a
        concurrent slot)."""
        limits = state.limits
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
        if slot and limits.concurrent and state.in_use >= state.slots:
            return False
        if limits.requests:
            state.allowance -= 1
        if slot and limits.concurrent:
            state.in_use += 1
            if state.idle_slots + waiting <= 0:  # (this request leaves the waiting ones)
                state.idle_since = 0.0
        return True

    @staticmethod
    def _spent(state: _KeyState, now: float) -> bool:
        """The ledger said no more for the window: it has no requests or tokens left until
        it ends. A request over such a limit is refused without an ask, so a flood of them
        costs the controller nothing."""
        limits = state.limits
        if limits.requests and state.allowance <= 0 and state.remaining == 0 and now < state.window_ends:
            return True
        return bool(limits.tokens) and state.tokens_used >= limits.tokens and now < state.window_ends

    @staticmethod
    def _slots_refused(state: _KeyState) -> bool:
        """The key's requests need more slots than the ledger gave."""
        return bool(state.limits.concurrent) and state.in_use >= state.slots

    def _free(self, state: _KeyState) -> None:
        """Slots held with no request: back to the ledger now if other fronts want them,
        else after :data:`SLOT_KEEP_S` (the keeper's)."""
        if state.idle_slots <= 0:
            return
        if state.contended:
            self._ask_soon(state)
        elif not state.idle_since:
            state.idle_since = time.monotonic()

    def _ask_soon(self, state: _KeyState) -> asyncio.Task[None]:
        """The key's ask: the one out, or a new one."""
        if state.asking is None:
            state.asking = asyncio.get_running_loop().create_task(self._ask(state))
            state.asking.add_done_callback(_log_failure)
        return state.asking

    async def _ask(self, state: _KeyState) -> None:
        """Ask the ledger for what ``state``'s waiting requests need, and hold the slots
        its requests use, until what the front holds is that (or the ledger has no more to
        give)."""
        try:
            for _ in range(8):
                now = time.monotonic()
                limits = state.limits
                slots = state.in_use + state.waiting - state.slotless if limits.concurrent else 0
                keep = state.idle_since and now - state.idle_since < SLOT_KEEP_S and not state.contended
                if keep and state.slots > slots:
                    slots = state.slots  # idle ones kept a while (a renewal)
                state.slots = min(state.slots, slots)  # slots on their way back are not used
                ask = QuotaAsk(
                    limits.key,
                    limits.window_s,
                    limits.requests,
                    self._want(state, now),
                    limits.concurrent,
                    slots,
                    limits.tokens,
                )
                (grant,) = await self._link.send((ask,))
                self._apply(state, grant, now)
                if not limits.concurrent or grant.slots < slots:
                    break
                if state.idle_slots == 0 or (state.idle_slots > 0 and not state.contended):
                    break  # holds what it uses (idle slots kept while none is wanted elsewhere)
        finally:
            state.asking = None

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

    def _apply(self, state: _KeyState, grant: QuotaGrant, asked_at: float) -> None:
        now = time.monotonic()
        limits = state.limits
        new_window = False
        if limits.requests or limits.tokens:
            window_ends = asked_at + grant.reset_in_s
            new_window = window_ends > state.window_ends + 0.5 * limits.window_s
            if new_window:
                state.allowance = 0  # a new window: what was left of the last is gone
            state.window_ends = window_ends
        if limits.requests:
            state.allowance += grant.requests
            state.remaining = grant.remaining
            if grant.requests:
                state.granted_at = now
        if limits.tokens:
            used = grant.tokens_used
            if self._link.cut_off and not new_window:  # the own ledger hears no charges
                used = max(used, state.tokens_used)
            state.tokens_used, state.tokens_heard = used, now
        if limits.concurrent:
            state.slots, state.contended, state.renewed_at = grant.slots, grant.contended, now
            if state.idle_slots <= 0:
                state.idle_since = 0.0
            elif not state.idle_since:
                state.idle_since = now
            if state.slots and self._keeper is None:
                self._keeper = asyncio.get_running_loop().create_task(self._keep())
                self._keeper.add_done_callback(_log_failure)

    async def _keep(self) -> None:
        """While slots are held: give back those idle for :data:`SLOT_KEEP_S`, and renew
        the holdings every third of a lease."""
        try:
            while any(state.slots for state in self._keys.values()):
                await asyncio.sleep(_KEEPER_TICK_S)
                now = time.monotonic()
                for state in self._keys.values():
                    if not state.slots or state.asking is not None:
                        continue
                    idle_long = state.idle_slots > 0 and now - state.idle_since >= SLOT_KEEP_S
                    if idle_long or now - state.renewed_at >= LEASE_S / 3:
                        self._ask_soon(state)
        finally:
            self._keeper = None

    def _refusal(self, state: _KeyState, request_id: str, slot: bool) -> HTTPResponse:
        limits = state.limits
        now = time.monotonic()
        over: Over
        if limits.requests and (state.allowance <= 0 or now >= state.window_ends):
            over = "requests"
        elif limits.tokens and (
            state.tokens_used >= limits.tokens
            or now - state.tokens_heard > TOKENS_FRESH_S
            or now >= state.window_ends
            or not slot
        ):
            over = "tokens"
        elif slot:
            over = "concurrent"
        else:  # (a slotless request of a key with a requests limit only)
            over = "requests"
        left = 0 if over == "requests" else max(0, state.remaining) + max(0, state.allowance)
        return too_many(limits, over, left, state.tokens_used, max(0.0, state.window_ends - now), request_id)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("API key limits: an ask failed", exc_info=task.exception())
