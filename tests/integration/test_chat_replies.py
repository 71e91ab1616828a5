"""The chat's page replies in Redis (CHAT_REPLY_STORE=redis) with two Replies replicas: a
reader resumes through any replica, and when every replica that could be generating a
reply is SIGKILLed, the replica a resuming reader reaches takes the reply over: the
reader gets the whole reply, no repeats, ids in order, its usage counted whole."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import ray

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import NAMESPACE
from examples.chat.chat.app import build_app
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
                events.append((event_id, kind, json.loads(line[6:])))
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
    settings = Settings(
        backend="echo",
        echo_tokens_per_s=20,
        reply_store="redis",
        redis_url=redis_url,
        reply_replicas=2,
        reply_writer_timeout_s=2.0,
    )
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
            actor = ray.get_actor(f"app_toolkit_replica:{replica.replica_id}", namespace=NAMESPACE)
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
            actor = ray.get_actor(f"app_toolkit_replica:{replica.replica_id}", namespace=NAMESPACE)
            os.kill(ray.get(actor.stats.remote(), timeout=30)["pid"], signal.SIGKILL)
        rest = read(client, reply_id, after=seen[-1][0])
    everything = seen + rest
    assert everything[-1][1] == "done", everything[-1]
    assert text(everything).split() == words  # whole, nothing repeated
    usage = everything[-1][2]["usage"]
    assert isinstance(usage, dict) and usage["completion_tokens"] == len(words)
