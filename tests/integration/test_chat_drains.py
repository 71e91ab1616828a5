"""Chat streams through a drain of the chat example, on both backends, read by the clients
people use: the official ``openai`` client and LangChain's ``ChatOpenAI`` (Chat
Completions and Responses), and the Vercel AI SDK in Node (``@ai-sdk/openai-compatible``
and ``@ai-sdk/openai``'s Responses model). A reply under way when its replicas start
draining (an upgrade) runs to its end; one still running at the drain's deadline ends
with an error each client raises, saying the server restarts."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import openai
from langchain_openai import ChatOpenAI

import app_toolkit as tk
from examples.chat.chat.app import build_app
from examples.chat.chat.settings import Settings
from tests import plain_http
from tests.conftest import ROOT, Toolkit
from tests.draining import drain_replica, replica_ids
from tests.waiting import wait_for

AI_SDK = ROOT / "tests" / "clients" / "ai_sdk"
#: The echo model, 20 words a second, one replica of it.
ECHO = Settings(backend="echo", echo_tokens_per_s=20, max_model_replicas=1)


@dataclass
class Followed:
    """One client's streamed reply, as the client saw it."""

    client: str
    pieces: list[str] = field(default_factory=list)
    finish: str | None = None  # how the client says the reply ended ("stop", "completed")
    error: BaseException | str | None = None  # what it raised (the AI SDK: its error part's message)
    last_line: str = ""  # the raw stream's last data line
    started: threading.Event = field(default_factory=threading.Event)
    ended_at: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def piece(self, text: str) -> None:
        if text:
            self.pieces.append(text)
            self.started.set()


def _openai_chat(base: str, prompt: str, out: Followed) -> None:
    with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
        with client.chat.completions.create(model="echo", messages=messages, stream=True) as stream:
            for chunk in stream:
                for choice in chunk.choices:
                    out.piece(choice.delta.content or "")
                    out.finish = choice.finish_reason or out.finish


def _openai_responses(base: str, prompt: str, out: Followed) -> None:
    with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        with client.responses.create(model="echo", input=prompt, stream=True) as stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    out.piece(event.delta)
                elif event.type == "response.completed":
                    out.finish = event.response.status


def _langchain(responses_api: bool) -> Callable[[str, str, Followed], None]:
    def follow(base: str, prompt: str, out: Followed) -> None:
        with httpx.Client(timeout=60) as http:  # closed here, with what a failed stream left open
            llm = ChatOpenAI(
                base_url=f"{base}/v1",
                api_key="unused",
                model="echo",
                max_retries=0,
                use_responses_api=responses_api,
                http_client=http,
            )
            for chunk in llm.stream(prompt):
                out.piece(chunk.text)
                said = chunk.response_metadata
                out.finish = said.get("finish_reason") or said.get("status") or out.finish

    return follow


def _raw_chat(base: str, prompt: str, out: Followed) -> None:
    """The Chat Completions stream's lines, to see its ``[DONE]``."""
    body = {"model": "echo", "messages": [{"role": "user", "content": prompt}], "stream": True}
    with plain_http.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            out.last_line = line[6:]
            if out.last_line != "[DONE]":
                for choice in json.loads(out.last_line).get("choices", []):
                    out.piece(choice["delta"].get("content") or "")
                    out.finish = choice["finish_reason"] or out.finish


PYTHON_CLIENTS: dict[str, Callable[[str, str, Followed], None]] = {
    "openai-chat": _openai_chat,
    "openai-responses": _openai_responses,
    "langchain-chat": _langchain(responses_api=False),
    "langchain-responses": _langchain(responses_api=True),
}


@dataclass
class Readers:
    """Every client following one reply each, in threads (the AI SDK in Node)."""

    replies: list[Followed]
    threads: list[threading.Thread]

    def wait_started(self) -> None:
        for reply in self.replies:
            assert reply.started.wait(30), f"{reply.client} got no piece: {reply.error!r}"

    def join(self) -> list[Followed]:
        for thread in self.threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in self.threads)
        return self.replies


def _run(follow: Callable[[], None], out: Followed) -> None:
    try:
        follow()
    except Exception as exc:  # noqa: BLE001 - the test reads what the client raised
        out.error = exc
    finally:
        out.ended_at = time.monotonic()


def _ai_sdk(base: str, provider: str, prompt: str, out: Followed) -> None:
    node = shutil.which("node")
    assert node is not None, "Node.js is not installed (the test setup installs it: make test)"
    assert (AI_SDK / "node_modules").is_dir(), "run `npm ci` in tests/clients/ai_sdk (make test does)"
    with subprocess.Popen(
        [node, "run.mjs", base, f"{provider}-follow", prompt],
        cwd=AI_SDK,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        lines: list[str] = []
        for line in process.stdout:
            lines.append(line)
            if '"started"' in line:
                out.started.set()
        assert process.wait(60) == 0, process.stderr.read()[-3000:]
    result = json.loads(lines[-1])
    out.pieces, out.finish = result["pieces"], result["finish"]
    out.error = "; ".join(result["errors"]) or None


def follow_replies(base: str, prompt: str, raw: bool = False) -> Readers:
    """Start one streamed reply to ``prompt`` per client (and a raw HTTP reader of a Chat
    Completions stream with ``raw``): the AI SDK's first, which take a second to start
    Node, then the others, so that all begin about together."""
    node: list[tuple[Followed, Callable[[], None]]] = []
    for provider in ("compatible", "responses"):
        out = Followed(f"ai-sdk-{provider}")
        node.append((out, functools.partial(_ai_sdk, base, provider, prompt, out)))
    python: list[tuple[Followed, Callable[[], None]]] = []
    for name, client in PYTHON_CLIENTS.items():
        out = Followed(name)
        python.append((out, functools.partial(client, base, prompt, out)))
    if raw:
        out = Followed("raw-chat")
        python.append((out, functools.partial(_raw_chat, base, prompt, out)))
    readers = Readers([], [])
    for group in (node, python):
        for out, follow in group:
            readers.replies.append(out)
            readers.threads.append(threading.Thread(target=_run, args=(follow, out), daemon=True))
            readers.threads[-1].start()
        readers.wait_started()
    return readers


def _old_replicas_stopping(app: str, deployments: tuple[str, ...], old: dict[str, str]) -> Iterator[str]:
    """The deployments whose replica of the old version is stopping now."""
    status = tk.status().applications[app].deployments
    for name in deployments:
        if any(
            r.code_version == old[name] and r.state is tk.ReplicaState.STOPPING for r in status[name].replicas
        ):
            yield name


def test_chat_streams_run_to_their_end_through_an_upgrade(toolkit: Toolkit) -> None:
    """About 14 s locally, 26 s on Ray: a reply per client (after the AI SDK's start),
    under way when the app is upgraded (every deployment gets a new version); the old
    replicas drain while the replies run."""
    name = toolkit.name()
    toolkit.run(build_app(ECHO), name=name, route_prefix="/")
    # At 20 words a second, 12 s locally and 24 s on Ray: the upgrade starts new replicas
    # before the old ones drain (on Ray 2 to 4 s on a busy 2-core host, 8 s once in a full
    # suite's run, over 12 s on a slower host's: a 12 s reply had ended before the old
    # ingress began to drain). Twice that, on Ray.
    words = [f"w{i}" for i in range(240 if toolkit.backend == "local" else 480)]
    readers = follow_replies(toolkit.url, " ".join(words), raw=True)
    relaying = ("Ingress", "ChatModel")
    old = {d: r.replicas[0].code_version for d, r in tk.status().applications[name].deployments.items()}
    # A new version of the app (other settings: other code for every deployment).
    upgrade = threading.Thread(
        target=toolkit.run,
        args=(build_app(ECHO.model_copy(update={"reply_keep_s": 61.0})),),
        kwargs={"name": name},
    )
    upgrade.start()
    stopping_at: dict[str, float] = {}

    def both_stopping() -> bool:
        for deployment in _old_replicas_stopping(name, relaying, old):
            stopping_at.setdefault(deployment, time.monotonic())
        return len(stopping_at) == len(relaying)

    wait_for(both_stopping, 30, "the old ingress and model replicas to drain", interval_s=0.02)
    replies = readers.join()
    upgrade.join(60)
    new = {d: r.replicas[0].code_version for d, r in tk.status().applications[name].deployments.items()}
    assert all(new[d] != old[d] for d in relaying)
    for reply in replies:
        # Each ran on while the replicas serving it drained, and ended whole: every word,
        # the finish reason, and (raw) the [DONE] line.
        assert reply.ended_at is not None and reply.ended_at > max(stopping_at.values()), reply.client
        assert reply.error is None, (reply.client, reply.error)
        assert reply.text == " ".join(words), reply.client
        assert reply.finish in ("stop", "completed"), (reply.client, reply.finish)
    assert replies[-1].last_line == "[DONE]"


def test_chat_streams_end_with_the_restart_error_at_the_drain_deadline(toolkit: Toolkit) -> None:
    """About 6 s: 30 s replies (after the AI SDK's start) are cut at the 3 s deadline of a drain
    (the app deleted)."""
    grace_s = 3.0
    name = toolkit.name()
    toolkit.run(build_app(ECHO.model_copy(update={"graceful_shutdown_timeout_s": grace_s})), name=name)
    words = [f"w{i}" for i in range(600)]  # 30 s at 20 words a second
    readers = follow_replies(toolkit.url, " ".join(words))
    began = time.monotonic()
    deleting = threading.Thread(target=tk.delete, args=(name,))
    deleting.start()  # every replica drains, with 3 s of grace
    replies = readers.join()
    deleting.join(60)
    for reply in replies:
        assert reply.ended_at is not None
        took = reply.ended_at - began
        # Not at once, as when streams ended as their drain began (the drain began after
        # `began`; 0.5 s for the clocks and the client's own steps) ...
        assert took >= grace_s - 0.5, (reply.client, took)
        # ... and well before the reply's own end (30 s) and the drain's kill (2 x 3 + 10 s):
        # the deadline ended it.
        assert took < 15, (reply.client, took)
        assert 0 < len(reply.text.split()) < len(words), reply.client
        if reply.client.startswith("ai-sdk"):  # an error part, and finish reason "error"
            assert reply.finish == "error" and "server is restarting" in str(reply.error), reply
        else:
            assert isinstance(reply.error, openai.APIError), (reply.client, reply.error)
            assert "The server is restarting; retry the request" in str(reply.error), reply.client
            assert reply.error.code == "server_restarting"


def test_replies_whose_model_replica_stops_at_its_deadline_end_with_the_restart_error(
    ray_toolkit: Toolkit,
) -> None:
    """About 6 s, on Ray, where a stopped replica's process is killed (the local backend
    leaves what still runs): the model replica is stopped as its controller stops it
    (drained with 2 s of grace, then killed) while two 30 s replies run, and the ingress
    relaying them ends them with the restart error, not a generic failure."""
    import ray

    from app_toolkit._runtime.backends.ray.cluster import replica_actor

    name = ray_toolkit.name()
    ray_toolkit.run(build_app(ECHO.model_copy(update={"graceful_shutdown_timeout_s": 2.0})), name=name)
    (model,) = replica_ids(name, "ChatModel")
    words = " ".join(f"w{i}" for i in range(600))  # 30 s at 20 words a second
    replies = [Followed("openai-chat"), Followed("openai-responses")]
    threads = [
        threading.Thread(
            target=_run, args=(functools.partial(PYTHON_CLIENTS[r.client], ray_toolkit.url, words, r), r)
        )
        for r in replies
    ]
    for thread in threads:
        thread.start()
    for reply in replies:
        assert reply.started.wait(30), reply.error
    began = time.monotonic()
    actor = replica_actor(model)
    drain_replica(ray_toolkit, model)
    ray.kill(actor, no_restart=True)
    for thread in threads:
        thread.join(60)
    for reply in replies:
        assert reply.ended_at is not None
        # It ran on through the model's 2 s of grace (0.5 s for the clocks), and ended well
        # before its own end (30 s).
        assert 1.5 <= reply.ended_at - began < 15, reply.client
        assert isinstance(reply.error, openai.APIError), (reply.client, reply.error)
        assert "The server is restarting; retry the request" in str(reply.error), reply.client
