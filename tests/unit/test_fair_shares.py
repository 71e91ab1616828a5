"""Fair shares in the caller-side queue: waiting requests are served by their API keys'
weights and priority classes, not first come first served (fake replicas)."""

from __future__ import annotations

import asyncio
import collections

import pytest

from app_toolkit._runtime.messages import MethodCall
from app_toolkit._runtime.request_values import Share
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit._runtime.routing.replica_client import Reply
from app_toolkit.exceptions import BackPressureError
from tests.unit.test_dispatcher import FakeReplica, answer, make

pytestmark = pytest.mark.anyio


def keyed(argument: str, key: str, weight: float = 1.0, priority: int = 0, shard_key: str = "") -> MethodCall:
    return MethodCall("rid", "method", (argument,), shard_key=shard_key, share=Share(key, weight, priority))


async def served_order(dispatcher: Dispatcher, replica: FakeReplica, calls: list[MethodCall]) -> list[str]:
    """Fill the one slot, queue ``calls`` in this order, then let them through one at a
    time: the order the replica received them in."""
    running = await dispatcher.send(MethodCall("rid", "method", ("first",)))
    waiting = [asyncio.ensure_future(dispatcher.send(call, shard_key=call.shard_key)) for call in calls]
    await asyncio.sleep(0)
    assert dispatcher.queued == len(calls)
    reply: Reply = running
    for _ in calls:
        reply.release()
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        reply = done.pop().result()
        waiting = [w for w in waiting if not w.done()]
    reply.release()
    return [str(argument) for argument in replica.received[1:]]


async def test_two_keys_of_equal_weight_take_turns_whatever_the_arrival_order() -> None:
    replica = FakeReplica("a", answer)
    calls = [keyed(f"noisy{n}", "noisy") for n in range(6)] + [keyed(f"quiet{n}", "quiet") for n in range(3)]
    order = await served_order(make({"a": replica}, max_queued=100), replica, calls)
    # The quiet key's requests came after six of the noisy key's, and go every other turn.
    assert order == ["noisy0", "quiet0", "noisy1", "quiet1", "noisy2", "quiet2", "noisy3", "noisy4", "noisy5"]


async def test_weights_share_the_turns_in_proportion() -> None:
    replica = FakeReplica("a", answer)
    calls = [keyed(f"a{n}", "a", weight=3) for n in range(30)] + [keyed(f"b{n}", "b") for n in range(30)]
    order = await served_order(make({"a": replica}, max_queued=100), replica, calls)
    first_twenty = collections.Counter(name[0] for name in order[:20])
    assert first_twenty == {"a": 15, "b": 5}


async def test_a_quiet_key_waits_one_turn_not_behind_the_queue() -> None:
    replica = FakeReplica("a", answer)
    dispatcher = make({"a": replica}, max_queued=100)
    reply = await dispatcher.send(MethodCall("rid", "method", ("first",)))
    waiting = [asyncio.ensure_future(dispatcher.send(keyed(f"noisy{n}", "noisy"))) for n in range(20)]
    await asyncio.sleep(0)

    async def next_served() -> Reply:
        nonlocal waiting
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        waiting = [w for w in waiting if not w.done()]
        return done.pop().result()

    for _ in range(5):  # the noisy key's turns alone bank the quiet key nothing
        reply.release()
        reply = await next_served()
    waiting.append(asyncio.ensure_future(dispatcher.send(keyed("quiet", "quiet"))))
    await asyncio.sleep(0)
    for _ in range(3):
        reply.release()
        reply = await next_served()
    reply.release()
    # Behind 15 of the noisy key's, the quiet request went next.
    assert replica.received[5:9] == ["noisy4", "quiet", "noisy5", "noisy6"]
    for waiter in waiting:
        waiter.cancel()


async def test_a_lower_priority_class_goes_first() -> None:
    replica = FakeReplica("a", answer)
    calls = [
        keyed("batch0", "batch", priority=5),
        keyed("batch1", "batch", priority=5),
        keyed("chat0", "chat", priority=-1),
        keyed("anon0", ""),
        keyed("chat1", "chat", priority=-1),
    ]
    order = await served_order(make({"a": replica}, max_queued=100), replica, calls)
    assert order == ["chat0", "chat1", "anon0", "batch0", "batch1"]


async def test_without_keys_the_line_is_first_come_first_served() -> None:
    replica = FakeReplica("a", answer)
    calls = [MethodCall("rid", "method", (f"n{n}",)) for n in range(5)]
    order = await served_order(make({"a": replica}, max_queued=100), replica, calls)
    assert order == [f"n{n}" for n in range(5)]


async def test_shard_keyed_requests_are_served_in_turn_too() -> None:
    replica = FakeReplica("a", answer)
    calls = [keyed(f"noisy{n}", "noisy", shard_key="s") for n in range(4)] + [
        keyed(f"quiet{n}", "quiet", shard_key="s") for n in range(2)
    ]
    order = await served_order(make({"a": replica}, max_queued=100), replica, calls)
    assert order == ["noisy0", "quiet0", "noisy1", "quiet1", "noisy2", "noisy3"]


async def test_a_full_line_makes_room_for_a_key_holding_fewer_places() -> None:
    replica = FakeReplica("a", answer)
    dispatcher = make({"a": replica}, max_queued=3)
    running = await dispatcher.send(MethodCall("rid", "method", ("first",)))
    noisy = [asyncio.ensure_future(dispatcher.send(keyed(f"noisy{n}", "noisy"))) for n in range(3)]
    await asyncio.sleep(0)
    quiet = asyncio.ensure_future(dispatcher.send(keyed("quiet", "quiet")))
    await asyncio.sleep(0)
    # The noisy key's newest place went to the quiet key; the noisy key's next is refused.
    await asyncio.wait([noisy[2]])
    with pytest.raises(BackPressureError):
        noisy[2].result()
    with pytest.raises(BackPressureError):
        await dispatcher.send(keyed("noisy3", "noisy"))
    assert dispatcher.queued == 3
    running.release()
    await asyncio.sleep(0)
    (await noisy[0]).release()
    (await quiet).release()
    (await noisy[1]).release()
    assert replica.received == ["first", "noisy0", "quiet", "noisy1"]
