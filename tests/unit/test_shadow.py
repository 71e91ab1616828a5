"""Shadow traffic in the caller (fake dispatchers): copies go after the primary, are
compared and counted; a full queue or a slow shadow drops copies, never delays the
primary. And the controller's side: checks, publishing, status."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.messages import (
    DeploymentID,
    HTTPRequest,
    HTTPResponse,
    MethodCall,
    Request,
    WebSocketOpen,
)
from app_toolkit._runtime.routing import shadow as shadow_module
from app_toolkit._runtime.routing.replica_client import Reply
from app_toolkit._runtime.routing.shadow import Shadower
from app_toolkit._runtime.tables import ReplicaTable, ShadowOutcome, ShadowTarget, replicas_key
from app_toolkit.config import ShadowOptions
from app_toolkit.exceptions import ConfigError, RequestLostError
from tests.unit.test_controller import FakeBackend, app, started

PRIMARY, SHADOW = DeploymentID("chat", "D"), DeploymentID("chat-v2", "D")
pytestmark = pytest.mark.anyio


def reply(status: int, body: bytes = b"") -> Reply:
    return Reply(
        HTTPResponse(status, [], body), Exchange(lambda: None), "r", lambda _: None, RequestLostError
    )


def same_words(primary: bytes, shadow: bytes) -> bool:
    """A compare function: the answers agree when they have the same words, in any case."""
    return primary.lower().split() == shadow.lower().split()


class FakeShadow:
    """Answers copies with the statuses given in turn, after ``delay_s``."""

    def __init__(self, statuses: list[int], delay_s: float = 0.0, bodies: list[bytes] | None = None) -> None:
        self.statuses = statuses
        self.delay_s = delay_s
        self.bodies = bodies or [b""]
        self.received: list[Any] = []

    async def send(
        self, message: Request, model_id: str = "", shard_key: str = "", split: bool = True
    ) -> Reply:
        n = len(self.received)
        self.received.append(message)
        await asyncio.sleep(self.delay_s)
        return reply(self.statuses[n % len(self.statuses)], self.bodies[n % len(self.bodies)])


def request(n: int) -> HTTPRequest:
    return HTTPRequest(f"req-{n}", {"type": "http", "method": "GET"}, b"")


async def drained(shadower: Shadower, copies: int) -> ShadowOutcome:
    for _ in range(200):
        if shadower.tally.copies + shadower.tally.dropped >= copies:
            break
        await asyncio.sleep(0.01)
    taken = shadower.take()
    assert taken is not None
    return taken


async def test_copies_are_compared_with_the_primary_and_counted() -> None:
    fake = FakeShadow([200, 500])
    shadower = Shadower(PRIMARY, lambda _: fake)
    shadower.configure(ShadowTarget(SHADOW, 1.0))
    for n in range(10):
        shadower.offer(request(n), "", reply(200), 0.002)
    outcome = await drained(shadower, 10)
    assert (outcome.copies, outcome.errors, outcome.different, outcome.dropped) == (10, 5, 5, 0)
    assert (outcome.endpoint, outcome.shadow) == ("chat", "chat-v2")
    assert sum(outcome.primary_latency_counts) == 10
    assert [m.request_id for m in fake.received][:2] == ["req-0-shadow", "req-1-shadow"]
    # Streams are never copied.
    shadower.offer(WebSocketOpen("ws-99", {"type": "websocket"}), "", reply(200), 0.001)
    shadower.offer(MethodCall("c", "tokens", (), stream=True), "", reply(200), 0.001)
    await asyncio.sleep(0.05)
    assert len(fake.received) == 10 and shadower.take() is None
    shadower.close()


async def test_a_compare_function_judges_the_bodies(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeShadow([200], bodies=[b"Hello World", b"hello   world", b"goodbye"])
    shadower = Shadower(PRIMARY, lambda _: fake)
    shadower.configure(ShadowTarget(SHADOW, 1.0, "tests.unit.test_shadow:same_words"))
    for n in range(6):
        shadower.offer(request(n), "", reply(200, b"hello world"), 0.002)
    outcome = await drained(shadower, 6)
    assert (outcome.copies, outcome.errors, outcome.different) == (6, 0, 2)  # the "goodbye"s
    # A function that cannot be imported where the caller runs: statuses only, said once.
    shadower.configure(ShadowTarget(SHADOW, 1.0, "no_such_module:same"))
    assert "cannot be imported here" in caplog.text
    for n in range(3):
        shadower.offer(request(n), "", reply(200, b"hello world"), 0.002)
    assert (await drained(shadower, 3)).different == 0
    shadower.close()


async def test_a_compare_function_may_be_named_by_its_dotted_path(caplog: pytest.LogCaptureFixture) -> None:
    path = "tests.unit.test_shadow.same_words"  # Ray's other form of an import path
    assert ShadowOptions(compare=path).compare == path
    fake = FakeShadow([200], bodies=[b"goodbye"])
    shadower = Shadower(PRIMARY, lambda _: fake)
    shadower.configure(ShadowTarget(SHADOW, 1.0, path))
    shadower.offer(request(0), "", reply(200, b"hello world"), 0.002)
    assert (await drained(shadower, 1)).different == 1  # the bodies were compared
    assert "cannot be imported" not in caplog.text
    shadower.close()


async def test_a_slow_shadow_drops_copies_instead_of_holding_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shadow_module, "COPY_TIMEOUT_S", 0.05)
    fake = FakeShadow([200], delay_s=10.0)
    shadower = Shadower(PRIMARY, lambda _: fake)
    shadower.configure(ShadowTarget(SHADOW, 1.0))
    loop = asyncio.get_running_loop()
    started = loop.time()
    for n in range(shadow_module.QUEUE_BOUND + shadow_module.WORKERS + 10):
        shadower.offer(request(n), "", reply(200), 0.001)
    assert loop.time() - started < 0.05  # offering never waits
    outcome = await drained(shadower, shadow_module.QUEUE_BOUND + shadow_module.WORKERS + 10)
    assert outcome.copies == 0 and outcome.dropped >= 10
    shadower.configure(None)  # turning it off stops the workers
    await asyncio.sleep(0)
    assert shadower.take() is None


async def test_the_controller_checks_publishes_and_reports_a_shadow() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app("chat", prefix="/chat")])
    await core.deploy_apps([app("chat-v2", prefix=None)])
    for to, fraction, message in (
        ("nope", 0.5, "No application 'nope'"),
        ("chat", 0.5, "cannot shadow itself"),
        ("chat-v2", 1.5, "fraction Input should be less than or equal to 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            await core.shadow("chat", to, fraction)
    with pytest.raises(ConfigError, match='must look like "module:attribute" or "module.attribute"'):
        await core.shadow("chat", "chat-v2", 0.5, "not a path")
    await core.shadow("chat", "chat-v2", 0.25)
    table = core.longpoll.get(replicas_key(PRIMARY))
    assert isinstance(table, ReplicaTable) and table.shadow == ShadowTarget(SHADOW, 0.25)
    counts = (0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0)  # 5 copies at ≤ 5 ms, 5 at ≤ 1 s
    await core.record_load("proxy", {}, (ShadowOutcome("chat", "chat-v2", 10, 5, 5, 3, counts, counts),))
    shadow = core.snapshot().applications["chat"].shadow
    assert shadow is not None and (shadow.copies, shadow.errors, shadow.different, shadow.dropped) == (
        10,
        5,
        5,
        3,
    )
    assert shadow.p99_ms is not None and 500 < shadow.p99_ms <= 1000
    await core.shadow("chat", None, 0)
    table = core.longpoll.get(replicas_key(PRIMARY))
    assert isinstance(table, ReplicaTable) and table.shadow is None
    assert core.snapshot().applications["chat"].shadow is None
    await core.stop()
