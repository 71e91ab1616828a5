"""The chat's page replies in Redis (CHAT_REPLY_STORE=redis) with two Replies replicas: a
reader resumes through any replica, and when every replica that could be generating a
reply is SIGKILLed, the replica a resuming reader reaches takes the reply over: the
reader gets the whole reply, no repeats, ids in order, its usage counted whole."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import ray

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import replica_actor
from examples.chat.chat import app as chat_app
from examples.chat.chat.app import build_app
from examples.chat.chat.model import ChatModel
from examples.chat.chat.replies import Replies
from examples.chat.chat.settings import Settings
from tests.conftest import Toolkit

Event = tuple[str, str, dict[str, object]]  # id, kind, data


def read(client: httpx.Client, reply_id: str, after: str = "", stop_after: int | None = None) -> list[Event]:
    headers = {"Last-Event-ID": after} if after else {}
    events: list[Event] = []
    event_id = kind = ""
    with client.stream("GET", f"/api/replies/{reply_id}/events", headers=headers) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:]) if kind != "drain" else {"message": line[6:]}
                events.append((event_id, kind, data))
                event_id = kind = ""
                if stop_after is not None and len(events) == stop_after:
                    break
    return events


def text(events: list[Event]) -> str:
    return "".join(str(data["text"]) for _, kind, data in events if kind == "token")


def start(client: httpx.Client, words: list[str]) -> str:
    body = {"messages": [{"role": "user", "content": " ".join(words)}]}
    response = client.post("/api/replies", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def test_page_replies_in_redis_resume_anywhere_and_outlive_their_writer(
    ray_toolkit: Toolkit, redis_url: str
) -> None:
    settings = _redis_settings(redis_url, writer_timeout_s=2.0)
    name = ray_toolkit.name()
    ray_toolkit.run(build_app(settings), name=name, route_prefix="/")
    words = [f"w{i}" for i in range(40)]
    with ray_toolkit.client() as client:
        for _ in range(3):  # several replies: both replicas generate some
            reply_id = start(client, words[:8])
            first = read(client, reply_id, stop_after=3)  # then the connection drops
            rest = read(client, reply_id, after=first[-1][0])
            everything = first + rest
            assert text(everything).split() == words[:8]
            assert everything[-1][1] == "done" and len({i for i, _, _ in everything}) == len(everything)

        # Every Replies replica dies while a reply is being generated (2 s of tokens).
        reply_id = start(client, words)
        seen = read(client, reply_id, stop_after=6)
        replicas = tk.status().applications[name].deployments["Replies"].replicas
        for replica in replicas:
            actor = replica_actor(replica.replica_id)
            os.kill(ray.get(actor.stats.remote(), timeout=30)["pid"], signal.SIGKILL)

        deadline = time.monotonic() + 60
        while True:  # until a replacement answers
            try:
                rest = read(client, reply_id, after=seen[-1][0])
                break
            except (AssertionError, httpx.HTTPError):
                assert time.monotonic() < deadline, "no Replies replica came back"
                time.sleep(0.5)
        everything = seen + rest
        assert everything[-1][1] == "done", everything[-1]  # taken over, not lost
        assert text(everything).split() == words  # whole, nothing repeated
        ids = [tuple(int(part) for part in event_id.split("-")) for event_id, _, _ in everything]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        usage = everything[-1][2]["usage"]
        assert isinstance(usage, dict) and usage["completion_tokens"] == len(words)
        assert usage["prompt_tokens"] == len(words)  # the echo model counts a word a token


def test_a_reply_goes_on_when_its_model_replica_is_killed(ray_toolkit: Toolkit) -> None:
    """The model replica producing a reply is SIGKILLed: another continues it from the
    text so far (the echo model skips what it said), and the reader gets one reply."""
    settings = Settings(backend="echo", echo_tokens_per_s=20)
    name = ray_toolkit.name()
    ray_toolkit.run(build_app(settings), name=name, route_prefix="/")
    words = [f"w{i}" for i in range(40)]
    with ray_toolkit.client() as client:
        reply_id = start(client, words)
        seen = read(client, reply_id, stop_after=6)
        for replica in tk.status().applications[name].deployments["ChatModel"].replicas:
            actor = replica_actor(replica.replica_id)
            os.kill(ray.get(actor.stats.remote(), timeout=30)["pid"], signal.SIGKILL)
        rest = read(client, reply_id, after=seen[-1][0])
    everything = seen + rest
    assert everything[-1][1] == "done", everything[-1]
    assert text(everything).split() == words  # whole, nothing repeated
    usage = everything[-1][2]["usage"]
    assert isinstance(usage, dict) and usage["completion_tokens"] == len(words)


class _ChatModelV2(ChatModel.func_or_class):  # type: ignore[misc,name-defined]
    """The model deployment's next version: other code, the same behaviour."""


def _resumed_reply(base_url: str, reply_id: str, deadline: float) -> list[Event]:
    """Every event of a reply, reconnecting with Last-Event-ID as a browser does when the
    line drops or the ingress replica drains (its `drain` event)."""
    events: list[Event] = []
    with httpx.Client(base_url=base_url, timeout=30) as client:
        while not events or events[-1][1] not in ("done", "failed"):
            assert time.monotonic() < deadline, f"reply {reply_id} did not end: {events[-3:]}"
            try:
                for event in read(client, reply_id, after=events[-1][0] if events else ""):
                    if event[1] != "drain":
                        events.append(event)
            except (AssertionError, httpx.HTTPError):
                time.sleep(0.3)  # the replica that served it is going away: ask again
    return events


def _redis_settings(redis_url: str, writer_timeout_s: float) -> Settings:
    """The echo model at 20 words a second, replies in Redis, two Replies replicas; model
    (and ingress) replicas that stop let their replies run on for 1 s only."""
    return Settings(
        backend="echo",
        echo_tokens_per_s=20,
        reply_store="redis",
        redis_url=redis_url,
        reply_replicas=2,
        reply_writer_timeout_s=writer_timeout_s,
        graceful_shutdown_timeout_s=1.0,
    )


def _replies_through_an_upgrade(
    toolkit: Toolkit,
    monkeypatch: pytest.MonkeyPatch,
    settings: Settings,
    deployment: Any,
    next_version: type,
    replies: int,
    words: list[str],
) -> _Upgrade:
    """Run the chat app with ``deployment`` (``ChatModel`` or ``Replies``) draining for 1 s
    (the model's grace period comes from ``settings``), start ``replies`` page replies of
    ``words``, and while readers follow them, deploy the app again with ``next_version`` of
    that deployment."""
    attribute = deployment.name
    monkeypatch.setattr(chat_app, attribute, deployment.options(graceful_shutdown_timeout_s=1.0))
    name = toolkit.name()
    toolkit.run(chat_app.build_app(settings), name=name, route_prefix="/")
    with toolkit.client() as client:
        reply_ids = [start(client, words) for _ in range(replies)]
        base_url = str(client.base_url)
    before = _versions(name, attribute)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(replies) as pool:
        readers = [pool.submit(_resumed_reply, base_url, reply_id, started + 120) for reply_id in reply_ids]
        time.sleep(1.0)  # every reply is under way
        upgraded = tk.Deployment(next_version, attribute, {**deployment.options()._options})
        monkeypatch.setattr(chat_app, attribute, upgraded.options(graceful_shutdown_timeout_s=1.0))
        toolkit.run(chat_app.build_app(settings), name=name, route_prefix="/")
        events = [reader.result() for reader in readers]
    return _Upgrade(events, before, _versions(name, attribute), time.monotonic() - started)


@dataclass
class _Upgrade:
    replies: list[list[Event]]  # every reader's events
    before: set[str]  # the upgraded deployment's code versions before
    after: set[str]  # and after
    took_s: float  # from the readers' start to the last reply's end


def _versions(app: str, deployment: str) -> set[str]:
    return {
        replica.code_version for replica in tk.status().applications[app].deployments[deployment].replicas
    }


def test_32_replies_go_through_a_rolling_upgrade_of_the_model_whole(
    ray_toolkit: Toolkit, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 page replies are being generated when the model deployment gets a new version;
    its old replica drains for 1 s only, so the replies it was producing are cut off and
    continued on the new one. Every reader gets its whole reply, no repeats, no gap."""
    words = [f"w{i}" for i in range(120)]  # 6 s of tokens each
    settings = _redis_settings(redis_url, writer_timeout_s=2.0)
    upgrade = _replies_through_an_upgrade(
        ray_toolkit, monkeypatch, settings, ChatModel, _ChatModelV2, 32, words
    )
    for events in upgrade.replies:
        assert events[-1][1] == "done", events[-1]
        assert text(events).split() == words  # whole, nothing repeated
        assert len({event_id for event_id, _, _ in events}) == len(events)
    # The replies outlived the version that began them.
    assert upgrade.after and not upgrade.after & upgrade.before


class _RepliesV2(Replies.func_or_class):  # type: ignore[misc,name-defined]
    """The Replies deployment's next version: other code, the same behaviour."""


def test_replies_whose_replica_is_upgraded_are_taken_over_at_once(
    ray_toolkit: Toolkit, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Replies deployment gets a new version while 8 replies are being generated; its
    old replicas drain for 1 s, then let go of the replies they still generate, and the
    new ones take them over at once (not after the 30 s writer timeout): every reader gets
    its whole reply."""
    words = [f"w{i}" for i in range(100)]  # 5 s of tokens each
    settings = _redis_settings(redis_url, writer_timeout_s=30.0)
    upgrade = _replies_through_an_upgrade(ray_toolkit, monkeypatch, settings, Replies, _RepliesV2, 8, words)
    for events in upgrade.replies:
        assert events[-1][1] == "done", events[-1]
        assert text(events).split() == words  # whole, nothing repeated
    assert upgrade.took_s < 25, f"the replies waited for the writer timeout: {upgrade.took_s:.1f} s"
