"""API key limits, as one ledger keeps them for the whole cluster.

Every front (each node's proxy, each ingress replica serving handed-off connections)
takes what it may admit from the ledger, which the controller holds, so a key's limits
hold across all of them:

- **Requests per window.** A front asks for a few requests of a key's window at a time
  (:class:`QuotaAsk.want`) and admits them on its own until they are spent. The ledger
  never grants more than the limit in a window, so a key is never over it; what a front
  was granted and did not use when the window ends is lost (the key gets a little less,
  bounded by what the fronts hold). Windows are the ledger's: they start at multiples of
  ``window_s`` of its clock, and a grant says how long its window has left.
- **Tokens per window** (LLM apps). What a reply used is charged to its key's window
  where the reply ends (``app_toolkit.charge_tokens``), and every ask is told how many the
  window has used: a front admits a key's requests while that count, as it last heard it,
  is under the limit.
- **Concurrent requests.** A front holds slots of a key (as many as its requests of that
  key in progress) and says how many it wants to hold with each ask; the ledger grants
  what the key's other holders leave. A holding is a lease: a front renews it while it
  holds slots, and a front that stops renewing (its process lost) gives them back after
  :data:`LEASE_S`.

The ledger lives in memory: a controller that restarts starts every key's window afresh,
so in the window it restarts a key may be sent up to twice its limit. A front that cannot
reach the controller keeps its own ledger until it can (each front is then one key's
whole limit: the worst case is the limit times the fronts).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

#: How long a front's holding of a key's slots lasts unless it is renewed.
LEASE_S = 10.0
#: How long after a front was refused a key's slot the key counts as contended (fronts
#: then give back idle slots at once).
CONTENDED_S = 1.0
#: Every this many calls the ledger drops the windows of keys no longer used.
_FORGET_EVERY = 4096


@dataclass(frozen=True, slots=True)
class QuotaAsk:
    """What one front asks of one key's limits: ``want`` more requests of the key's
    window (limit ``requests`` per ``window_s``; 0: no such limit), and to hold ``slots``
    of its ``concurrent`` slots in all (0 limit: no such limit); with a ``tokens`` limit,
    the window's count of tokens comes back."""

    key: str
    window_s: float
    requests: int
    want: int
    concurrent: int
    slots: int
    tokens: int = 0  # the key's tokens per window (0: no such limit)


@dataclass(frozen=True, slots=True)
class QuotaGrant:
    """The ledger's answer: ``requests`` granted of the window (which ends in
    ``reset_in_s`` and has ``remaining`` left after this grant), and the ``slots`` the
    front now holds; the window's tokens charged so far."""

    requests: int
    remaining: int
    reset_in_s: float
    slots: int
    tokens_used: int = 0
    contended: bool = False  # some front was refused a slot of the key lately


#: Tokens to charge, by key name.
Charges = tuple[tuple[str, int], ...]
#: How a front reaches the ledger: its id and its asks, one per key (and charges).
TakeQuota = Callable[[str, tuple[QuotaAsk, ...], Charges], Awaitable[tuple[QuotaGrant, ...]]]


@dataclass(slots=True)
class _Window:
    index: int = -1
    used: int = 0
    tokens: int = 0

    def now(self, index: int) -> _Window:
        if self.index != index:
            self.index, self.used, self.tokens = index, 0, 0
        return self


@dataclass(slots=True)
class _Slots:
    #: front -> (slots held, when the lease ends)
    held: dict[str, tuple[int, float]] = field(default_factory=dict)


class QuotaLedger:
    """Every key's requests used in its current window, and who holds its slots.
    ``clock``: wall-clock seconds (windows start at multiples of their length)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._windows: dict[tuple[str, float], _Window] = {}
        self._slots: dict[str, _Slots] = {}
        #: The window length of each key whose tokens are limited (as fronts ask).
        self._token_window_s: dict[str, float] = {}
        self._refused_at: dict[str, float] = {}  # key -> when a front was last refused a slot
        self._calls = 0

    def take(self, front: str, asks: tuple[QuotaAsk, ...], charges: Charges = ()) -> tuple[QuotaGrant, ...]:
        """Charge ``charges`` to their keys' windows, then grant each ask what its key's
        limits leave."""
        now = self._clock()
        self._calls += 1
        if self._calls % _FORGET_EVERY == 0:
            self.forget()
        for key, tokens in charges:
            window_s = self._token_window_s.get(key)
            if window_s is not None:  # else no front keeps a tokens limit for the key
                self._window(key, window_s, now).tokens += tokens
        return tuple(self._take_one(front, ask, now) for ask in asks)

    def _window(self, key: str, window_s: float, now: float) -> _Window:
        return self._windows.setdefault((key, window_s), _Window()).now(math.floor(now / window_s))

    def _take_one(self, front: str, ask: QuotaAsk, now: float) -> QuotaGrant:
        granted = remaining = tokens = 0
        reset_in = ask.window_s
        if ask.requests > 0 or ask.tokens > 0:
            window = self._window(ask.key, ask.window_s, now)
            if ask.requests > 0:
                granted = max(0, min(ask.want, ask.requests - window.used))
                window.used += granted
                remaining = max(0, ask.requests - window.used)
            if ask.tokens > 0:
                self._token_window_s[ask.key] = ask.window_s
                tokens = window.tokens
            reset_in = (window.index + 1) * ask.window_s - now
        slots = self._hold(front, ask, now) if ask.concurrent > 0 else ask.slots
        contended = now - self._refused_at.get(ask.key, -CONTENDED_S) < CONTENDED_S
        return QuotaGrant(granted, remaining, reset_in, slots, tokens, contended)

    def _hold(self, front: str, ask: QuotaAsk, now: float) -> int:
        holders = self._slots.setdefault(ask.key, _Slots())
        for other, (_, until) in list(holders.held.items()):
            if until <= now:
                del holders.held[other]
        others = sum(count for other, (count, _) in holders.held.items() if other != front)
        holding = max(0, min(ask.slots, ask.concurrent - others))
        if holding < ask.slots:
            self._refused_at[ask.key] = now
        if holding:
            holders.held[front] = (holding, now + LEASE_S)
        else:
            holders.held.pop(front, None)
            if not holders.held:
                del self._slots[ask.key]
        return holding

    def forget(self, keep_windows_s: float = 3600.0) -> None:
        """Drop what is known of keys not used for ``keep_windows_s``: windows that ended,
        token window lengths, lapsed leases and old refusals."""
        now = self._clock()
        for where, window in list(self._windows.items()):
            if (window.index + 1) * where[1] + keep_windows_s < now:
                del self._windows[where]
        used = {key for key, _ in self._windows}
        for key in [key for key in self._token_window_s if key not in used]:
            del self._token_window_s[key]
        for key in [key for key, at in self._refused_at.items() if at + keep_windows_s < now]:
            del self._refused_at[key]
        for key, holders in list(self._slots.items()):
            holders.held = {front: held for front, held in holders.held.items() if held[1] > now}
            if not holders.held:
                del self._slots[key]
