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


async def test_a_small_weight_waits_its_turns_even_one_request_at_a_time() -> None:
    # Key b (weight 0.25) sends its next request as soon as the last one is served: its
    # flow empties every time, and comes back where its pass had got to, not ahead.
    replica = FakeReplica("a", answer)
    dispatcher = make({"a": replica}, max_queued=100)
    reply = await dispatcher.send(MethodCall("rid", "method", ("first",)))
    waiting = [asyncio.ensure_future(dispatcher.send(keyed(f"a{n}", "a"))) for n in range(40)]
    waiting.append(asyncio.ensure_future(dispatcher.send(keyed("b", "b", weight=0.25))))
    await asyncio.sleep(0)
    for _ in range(30):
        reply.release()
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        waiting = [w for w in waiting if not w.done()]
        reply = done.pop().result()
        if replica.received[-1] == "b":  # b at once asks again
            waiting.append(asyncio.ensure_future(dispatcher.send(keyed("b", "b", weight=0.25))))
            await asyncio.sleep(0)
    reply.release()
    assert replica.received[1:31].count("b") in (6, 7)  # a fifth of 30 turns, not half
    for waiter in waiting:
        waiter.cancel()


async def test_a_full_line_never_refuses_a_lower_class_for_a_higher_one() -> None:
    replica = FakeReplica("a", answer)
    dispatcher = make({"a": replica}, max_queued=2)
    running = await dispatcher.send(MethodCall("rid", "method", ("first",)))
    batch = [
        asyncio.ensure_future(dispatcher.send(keyed(f"batch{n}", "batch", priority=5))) for n in range(2)
    ]
    await asyncio.sleep(0)
    # A request of a lower class takes the batch key's newest place...
    chat = asyncio.ensure_future(dispatcher.send(keyed("chat0", "chat", priority=-1)))
    await asyncio.wait([batch[1]])
    with pytest.raises(BackPressureError):
        batch[1].result()
    # ...and one of a higher class gets no place of the lower class's.
    chat_next = asyncio.ensure_future(dispatcher.send(keyed("chat1", "chat", priority=-1)))
    await asyncio.sleep(0)
    with pytest.raises(BackPressureError):
        await dispatcher.send(keyed("late", "late", priority=9))
    await asyncio.wait([batch[0]], timeout=1)  # batch0 made room for chat1
    with pytest.raises(BackPressureError):
        batch[0].result()
    assert not chat.done() and not chat_next.done()
    running.release()
    for waiter in (chat, chat_next):
        (await waiter).release()
    assert replica.received == ["first", "chat0", "chat1"]


async def test_a_request_given_up_on_in_a_line_of_two_keys_is_skipped() -> None:
    replica = FakeReplica("a", answer)
    dispatcher = make({"a": replica}, max_queued=100)
    running = await dispatcher.send(MethodCall("rid", "method", ("first",)))
    waiting = [
        asyncio.ensure_future(dispatcher.send(keyed(f"{key}{n}", key))) for n in range(2) for key in "ab"
    ]
    await asyncio.sleep(0)
    waiting[0].cancel()  # a0
    await asyncio.wait([waiting[0]])
    reply = running
    for _ in range(3):
        reply.release()
        done, _ = await asyncio.wait(
            [w for w in waiting if not w.done()], return_when=asyncio.FIRST_COMPLETED
        )
        reply = done.pop().result()
    reply.release()
    assert replica.received == ["first", "b0", "a1", "b1"]
    assert dispatcher.queued == 0


async def test_turns_start_afresh_once_the_line_has_emptied() -> None:
    # b (weight 0.001) was served once in a busy spell: its next turn would be 1,000 of
    # a's away. Once nothing waits, that is forgotten: it owes nothing to a later spell.
    replica = FakeReplica("a", answer)
    dispatcher = make({"a": replica}, max_queued=100)
    spell = [keyed("b0", "b", weight=0.001), keyed("a0", "a")]
    assert await served_order(dispatcher, replica, spell) == ["b0", "a0"]
    replica.received.clear()
    later = [keyed(f"a{n}", "a") for n in range(1, 4)] + [keyed("b1", "b", weight=0.001)]
    assert (await served_order(dispatcher, replica, later)).index("b1") <= 1
