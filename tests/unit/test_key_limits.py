"""API keys' limits: the cluster's ledger (``_runtime/quotas.py``) and one front's share of
it (``front/key_limits.py``), with a clock the tests move."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Coroutine

import pytest

from app_toolkit._runtime import token_charges
from app_toolkit._runtime.front import ledger_link
from app_toolkit._runtime.front.key_limits import SLOT_KEEP_S, TOKENS_FRESH_S, KeyLimits
from app_toolkit._runtime.front.rate_limits import Limits, reset_text
from app_toolkit._runtime.quotas import LEASE_S, Charges, QuotaAsk, QuotaGrant, QuotaLedger
from app_toolkit.config import parse_http_options
from app_toolkit.config.api_keys import APIKey, key_hash, new_key
from app_toolkit.exceptions import ConfigError
from app_toolkit.llm.events import Delta
from app_toolkit.llm.openai.replies import Metered


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _requests(want: int, limit: int = 10, window_s: float = 10.0) -> QuotaAsk:
    return QuotaAsk("k", window_s, limit, want, 0, 0)


def _slots(held: int, limit: int = 3) -> QuotaAsk:
    return QuotaAsk("k", 60.0, 0, 0, limit, held)


def test_the_ledger_never_grants_more_than_a_windows_limit_whatever_the_fronts() -> None:
    clock = Clock(1003.0)  # 3 s into the window [1000, 1010)
    ledger = QuotaLedger(clock)
    (first,) = ledger.take("a", (_requests(4),))
    assert (first.requests, first.remaining) == (4, 6)
    assert first.reset_in_s == pytest.approx(7.0)
    (second,) = ledger.take("b", (_requests(8),))
    assert (second.requests, second.remaining) == (6, 0)  # what was left, not what was asked
    assert ledger.take("a", (_requests(1),))[0].requests == 0
    clock.now = 1010.0  # the next window: the count starts again
    (fresh,) = ledger.take("a", (_requests(3),))
    assert (fresh.requests, fresh.remaining) == (3, 7)
    assert fresh.reset_in_s == pytest.approx(10.0)
    # Another window length is another count.
    assert ledger.take("a", (_requests(5, window_s=60.0),))[0].requests == 5


def test_slots_are_shared_between_fronts_and_a_lost_fronts_lease_ends() -> None:
    clock = Clock()
    ledger = QuotaLedger(clock)
    assert ledger.take("a", (_slots(2),))[0].slots == 2
    assert ledger.take("b", (_slots(2),))[0].slots == 1  # the limit is 3 in all
    assert ledger.take("a", (_slots(0),))[0].slots == 0  # a gives its slots back
    assert ledger.take("b", (_slots(3),))[0].slots == 3
    assert ledger.take("a", (_slots(1),))[0].slots == 0
    clock.now += LEASE_S + 0.1  # b stopped renewing (its process lost): its lease ends
    assert ledger.take("a", (_slots(3),))[0].slots == 3


class Ledger:
    """The controller's ledger behind a call that can be made to fail, counting the asks."""

    def __init__(self) -> None:
        self.ledger = QuotaLedger(Clock())
        self.asks: list[QuotaAsk] = []
        self.down = False

    async def take(self, front: str, asks: tuple[QuotaAsk, ...], charges: Charges) -> tuple[QuotaGrant, ...]:
        await asyncio.sleep(0.001)  # an actor call's round trip
        if self.down:
            raise ConnectionError("the controller is gone")
        self.asks.extend(asks)
        return self.ledger.take(front, asks, charges)


def test_requests_over_a_window_get_429_with_openais_headers() -> None:
    ledger = Ledger()
    limits = Limits("alice", 60.0, 10, 0)

    async def main() -> list[object]:
        fronts = KeyLimits(ledger.take), KeyLimits(ledger.take)
        answers = await asyncio.gather(*(fronts[i % 2].enter(limits, f"r{i}") for i in range(40)))
        for front in fronts:
            front.close()
        return list(answers)

    answers = asyncio.run(main())
    admitted = [answer for answer in answers if answer is None]
    refused = [answer for answer in answers if answer is not None]
    assert len(admitted) == 10  # two fronts, one window: the limit and no more
    assert len(ledger.asks) <= 8  # asks for waiting requests go together
    refusal = refused[0]
    assert refusal is not None and refusal.status == 429  # type: ignore[attr-defined]
    headers = dict(refusal.headers)  # type: ignore[attr-defined]
    assert headers[b"x-ratelimit-limit-requests"] == b"10"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"
    assert headers[b"x-ratelimit-reset-requests"] == b"20s"  # the window [960, 1020) of the clock
    assert headers[b"retry-after"] == b"20"
    error = json.loads(refusal.body)["error"]  # type: ignore[attr-defined]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")
    assert "10 per 60 s" in error["message"] and "alice" in error["message"]


def test_a_busy_key_takes_more_per_ask_and_the_window_is_never_passed() -> None:
    ledger = Ledger()
    limits = Limits("busy", 60.0, 1000, 0)

    async def main() -> int:
        front = KeyLimits(ledger.take)
        admitted = 0
        for i in range(1200):  # one at a time: no request waits beside another
            admitted += await front.enter(limits, str(i)) is None
        front.close()
        return admitted

    assert asyncio.run(main()) == 1000
    assert len(ledger.asks) < 60  # not one ask per request


def test_concurrent_requests_over_the_limit_get_429_until_one_ends() -> None:
    ledger = Ledger()
    limits = Limits("single", 60.0, 0, 1)

    async def main() -> None:
        front, other = KeyLimits(ledger.take), KeyLimits(ledger.take)
        assert await front.enter(limits, "a") is None
        refusal = await other.enter(limits, "b")  # the slot is held on the first front
        assert refusal is not None and refusal.status == 429
        headers = dict(refusal.headers)
        assert headers[b"retry-after"] == b"1"
        assert b"x-ratelimit-limit-requests" not in headers  # no request limit to tell of
        assert "at most 1 at once" in json.loads(refusal.body)["error"]["message"]
        front.leave(limits)
        # The first front keeps its idle slot a moment, then gives it back: a request on the
        # other front waits for it rather than get a 429.
        started = time.monotonic()
        assert await other.enter(limits, "c") is None
        assert time.monotonic() - started >= SLOT_KEEP_S / 2
        other.leave(limits)
        front.close()
        other.close()

    asyncio.run(main())


def test_a_front_that_cannot_reach_the_controller_keeps_the_limits_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = Ledger()
    ledger.down = True
    limits = Limits("alice", 60.0, 3, 0)

    async def main() -> list[bool]:
        front = KeyLimits(ledger.take)
        admitted = [await front.enter(limits, str(i)) is None for i in range(5)]
        front.close()
        return admitted

    with caplog.at_level(logging.WARNING, "app_toolkit.proxy"):
        assert asyncio.run(main()) == [True, True, True, False, False]
    warnings = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(warnings) == 1 and "ConnectionError" in warnings[0]


def test_tokens_are_charged_to_a_keys_window_once_a_front_keeps_its_limit() -> None:
    clock = Clock(1000.0)
    ledger = QuotaLedger(clock)
    ask = QuotaAsk("k", 10.0, 0, 0, 0, 0, tokens=100)
    ledger.take("charger", (), (("k", 50),))  # no front keeps a tokens limit for k yet
    assert ledger.take("a", (ask,))[0].tokens_used == 0
    ledger.take("charger", (), (("k", 70), ("other", 5)))
    assert ledger.take("b", (ask,))[0].tokens_used == 70
    clock.now = 1010.0
    assert ledger.take("a", (ask,))[0].tokens_used == 0  # a new window


def test_a_keys_requests_get_429_once_its_windows_tokens_are_used() -> None:
    ledger = Ledger()
    limits = Limits("llm", 60.0, 0, 0, tokens=100)

    async def main() -> None:
        front = KeyLimits(ledger.take)
        assert await front.enter(limits, "a") is None
        asks = len(ledger.asks)
        assert await front.enter(limits, "b") is None  # the count is fresh: no ask
        assert len(ledger.asks) == asks
        ledger.ledger.take("charger", (), (("llm", 120),))  # replies ended elsewhere
        await asyncio.sleep(TOKENS_FRESH_S + 0.05)  # the count is old: asked again
        refusal = await front.enter(limits, "c")
        assert refusal is not None and refusal.status == 429
        headers = dict(refusal.headers)
        assert headers[b"x-ratelimit-limit-tokens"] == b"100"
        assert headers[b"x-ratelimit-remaining-tokens"] == b"0"
        assert b"x-ratelimit-limit-requests" not in headers
        error = json.loads(refusal.body)["error"]
        assert error["type"] == "tokens" and "100 per 60 s" in error["message"]
        asks = len(ledger.asks)
        assert await front.enter(limits, "d") is not None  # refused without an ask
        assert len(ledger.asks) == asks
        front.close()

    asyncio.run(main())


def test_a_metered_reply_charges_its_prompt_and_each_choices_tokens_once() -> None:
    class Model:
        def __init__(self, deltas: list[Delta]) -> None:
            self.deltas = iter(deltas)
            self.cancelled = False

        def __aiter__(self) -> Model:
            return self

        async def __anext__(self) -> Delta:
            try:
                return next(self.deltas)
            except StopIteration:
                raise StopAsyncIteration from None

        def cancel(self) -> None:
            self.cancelled = True

    async def read(deltas: list[Delta], pieces: int | None = None) -> list[int]:
        charged: list[int] = []
        stream = Metered(Model(deltas), 7, charged.append)
        if pieces is None:
            async for _ in stream:
                pass
        else:
            for _ in range(pieces):
                await anext(stream)
            stream.cancel()
        stream.cancel()  # once only
        return charged

    whole = [
        Delta(text="a"),
        Delta(text="b", index=1),
        Delta(finish_reason="stop", completion_tokens=5),
        Delta(finish_reason="length", completion_tokens=9, index=1),
    ]
    assert asyncio.run(read(whole)) == [7 + 5 + 9]
    # Cut after three pieces: choice 0 finished (5), choice 1 sent one piece.
    assert asyncio.run(read([whole[0], whole[1], whole[2], Delta(text="c", index=1)], pieces=4)) == [
        7 + 5 + 2
    ]


def test_two_fronts_never_hold_more_than_the_concurrent_limit_whatever_the_order() -> None:
    """Requests of one key come and go at random on two fronts, some cancelled while they
    wait for an ask: never more than the limit run at once, and every admission is left."""
    ledger = Ledger()
    limits = Limits("k", 60.0, 0, 3)
    running, most, admitted = 0, 0, 0
    rng = random.Random(7)

    async def one(front: KeyLimits, i: int) -> None:
        nonlocal running, most, admitted
        await asyncio.sleep(rng.uniform(0, 0.05))
        if await front.enter(limits, str(i)) is not None:
            return
        running += 1
        admitted += 1
        most = max(most, running)
        await asyncio.sleep(rng.uniform(0, 0.01))
        running -= 1
        front.leave(limits)

    async def main() -> None:
        fronts = KeyLimits(ledger.take), KeyLimits(ledger.take)
        tasks = [asyncio.create_task(one(fronts[i % 2], i)) for i in range(200)]
        await asyncio.sleep(0.02)
        for task in tasks[::7]:
            task.cancel()  # some leave while they wait
        await asyncio.gather(*tasks, return_exceptions=True)
        for front in fronts:
            front.close()

    asyncio.run(main())
    assert admitted >= 3 and most <= 3  # (how many get in depends on the timing: some do)


def test_a_request_that_comes_while_an_ask_is_out_does_not_take_the_asker_s_grant() -> None:
    """A request that comes between a grant and the wake of the request that asked for it
    waits its turn: both are admitted when the window has room."""
    ledger = Ledger()
    limits = Limits("k", 60.0, 100, 0)

    async def main() -> list[object]:
        front = KeyLimits(ledger.take)
        first = asyncio.create_task(front.enter(limits, "first"))
        await asyncio.sleep(0)  # the first's ask is out
        second = asyncio.create_task(front.enter(limits, "second"))
        answers: list[object] = [await first, await second]
        front.close()
        return answers

    assert asyncio.run(main()) == [None, None]


def test_a_controller_that_does_not_answer_costs_one_request_one_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ledger_link, "ASK_TIMEOUT_S", 0.2)

    async def hangs(front: str, asks: tuple[QuotaAsk, ...], charges: Charges) -> tuple[QuotaGrant, ...]:
        await asyncio.sleep(60)
        raise AssertionError("never answered")

    async def main() -> list[float]:
        front = KeyLimits(hangs)
        limits = Limits("k", 60.0, 0, 4)
        waits = []
        for i in range(3):
            started = time.monotonic()
            assert await front.enter(limits, str(i)) is None
            waits.append(time.monotonic() - started)
            front.leave(limits)
        front.close()
        return waits

    first, *others = asyncio.run(main())
    assert first >= 0.2 and all(wait < 0.1 for wait in others)


def test_token_charges_from_many_threads_go_in_few_sends_and_none_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[Charges] = []

    class Plane:
        def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
            self.loop = loop

        def submit(self, coroutine: Coroutine[object, object, None]) -> None:
            self.loop.call_soon_threadsafe(self.loop.create_task, coroutine)

    class Session:
        def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
            self.data_plane = Plane(loop)

        async def take_quota(self, front: str, asks: tuple[QuotaAsk, ...], charges: Charges) -> tuple[()]:
            await asyncio.sleep(0.01)
            sent.append(charges)
            return ()

    async def main() -> None:
        session = Session(asyncio.get_running_loop())
        monkeypatch.setattr(token_charges, "current_session", lambda create: session)
        charges = token_charges.TokenCharges()

        def charge(key: str) -> None:
            for _ in range(1000):
                charges.add(key, 1)

        await asyncio.gather(*(asyncio.to_thread(charge, key) for key in ("a", "a", "b", "a")))
        await asyncio.sleep(token_charges.FLUSH_S * 4)

    asyncio.run(main())
    totals: dict[str, int] = {}
    for batch in sent:
        for key, tokens in batch:
            totals[key] = totals.get(key, 0) + tokens
    assert totals == {"a": 3000, "b": 1000}
    assert 1 <= len(sent) <= 4 and all(sent)  # batched; no empty send


def test_a_limit_raised_in_the_keys_file_is_asked_for_at_once() -> None:
    """A key spent under its old limit gets in under the new one, though its window has
    not ended (the keys file read again makes other Limits)."""
    ledger = Ledger()

    async def main() -> list[bool]:
        front = KeyLimits(ledger.take)
        old, raised = Limits("k", 3600.0, 2, 0), Limits("k", 3600.0, 5, 0)
        admitted = [await front.enter(old, str(i)) is None for i in range(3)]
        admitted += [await front.enter(raised, str(i)) is None for i in range(3)]
        front.close()
        return admitted

    assert asyncio.run(main()) == [True, True, False, True, True, True]


def test_reset_times_read_as_openais() -> None:
    assert [reset_text(s) for s in (0.0, 0.85, 1.0, 12.2, 360.0, 3723.0)] == [
        "0ms",
        "850ms",
        "1s",
        "13s",
        "6m0s",
        "1h2m3s",
    ]


def test_limits_are_options_of_a_key() -> None:
    key = APIKey(name="a", hash=key_hash(new_key()), requests_per_window=5, window_s=10)
    assert Limits.of(key) == Limits("a", 10.0, 5, 0)
    tokens = APIKey(name="t", hash=key_hash(new_key()), tokens_per_window=900)
    assert Limits.of(tokens) == Limits("t", 60.0, 0, 0, 900)
    assert Limits.of(APIKey(name="b", hash=key_hash(new_key()))) is None
    for wrong in (
        {"requests_per_window": 0},
        {"max_concurrent_requests": -1},
        {"window_s": 0},
        {"tokens_per_window": 0},
    ):
        with pytest.raises(ConfigError) as raised:
            parse_http_options({"api_keys": [{"name": "a", "hash": key_hash(new_key()), **wrong}]})
        assert next(iter(wrong)) in str(raised.value)
