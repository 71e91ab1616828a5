"""The soak's longer-lived clients: resumable replies (resumed after every cut from their
last event id), WebSocket sessions, and the LLM endpoints (streamed chat completions,
whose every word is checked against the prompt the echo engine repeats, or against
SmolLM2's greedy reply made before the kills)."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from benchmarks.soak_apps import ECHO_MODEL, LLM_PREFIX, SMOL_MODEL, SMOL_TOKENS
from benchmarks.soak_rules import Record
from benchmarks.soak_traffic import (
    REPLY_EVENTS,
    RESUME_FOR_S,
    RETRY_AFTER_FAILURE_S,
    TIMEOUT_S,
    WORDS,
    Exchange,
    Traffic,
    _events,
    _expect,
    check_sequence,
    failure,
    finish,
)

WEBSOCKET_MESSAGES = 10


def resumable_exchange(traffic: Traffic) -> Exchange:
    """Start a reply, read it, and after a cut (or a drain event) resume it from the last
    event id, as an ``EventSource`` does, until it ends or RESUME_FOR_S pass."""

    async def exchange(client: httpx.AsyncClient, record: Record, rng: random.Random) -> None:
        response = await client.post("/replies", params={"count": REPLY_EVENTS, "delay": 0.05})
        if not await _expect(record, response, traffic):
            return
        reply = response.json()["reply"]
        record.writer, record.writer_node = record.replica, record.node
        got: list[str] = []
        last_id = ""
        give_up = time.monotonic() + RESUME_FOR_S
        while True:
            ended = False
            record.proxy_node = ""  # this connection's, once its answer comes
            try:
                headers = {"last-event-id": last_id} if last_id else {}
                async with client.stream("GET", f"/replies/{reply}", headers=headers) as response:
                    if not await _expect(record, response, traffic):
                        if response.status_code in (404, 410):
                            record.outcome = "store-lost" if response.status_code == 404 else "abandoned"
                        return_now = response.status_code < 500 or time.monotonic() > give_up
                        if return_now:
                            return
                    else:
                        drained = False
                        async for event in _events(response):
                            if event.get("event") == "drain":
                                drained = True
                            elif "data" in event:
                                got.append(event["data"])
                                last_id = event.get("id", last_id)
                        ended = not drained
            except httpx.HTTPError as exc:
                record.outcome, record.detail = failure(exc)
            if ended:
                record.outcome, record.detail, record.status = "intact", "", 0
                break
            if time.monotonic() > give_up:
                return  # the last failure stands
            record.cuts.append(time.monotonic())
            record.cut_proxies.append(record.proxy_node)
            await asyncio.sleep(0.2)
        if wrong := check_sequence(got, REPLY_EVENTS):
            record.outcome, record.detail = "corrupt", wrong
        elif len(got) < REPLY_EVENTS:
            record.outcome, record.detail = "abandoned", f"ended after {len(got)} of {REPLY_EVENTS} events"

    return exchange


async def websocket_loop(traffic: Traffic, number: int) -> None:
    """Sessions of WEBSOCKET_MESSAGES echoed messages, each on a new connection."""
    rng = random.Random(f"{traffic.seed}:websocket:{number}")
    while not traffic.done():
        record = Record("websocket", time.monotonic())
        try:
            async with asyncio.timeout(TIMEOUT_S):
                async with connect(f"ws://127.0.0.1:{traffic.port}/ws", open_timeout=TIMEOUT_S) as socket:
                    record.head = True
                    hello = json.loads(await socket.recv())
                    record.node, record.replica = hello["node"], hello["replica"]
                    sockname = socket.transport.get_extra_info("sockname")
                    record.proxy_node = traffic.proxies.node_of(sockname[1]) if sockname else ""
                    for _ in range(WEBSOCKET_MESSAGES):
                        said = str(rng.random())
                        await socket.send(said)
                        if (echoed := await socket.recv()) != said:
                            record.outcome, record.detail = "corrupt", f"sent {said!r}, got {echoed!r}"
                            break
        except InvalidStatus as exc:
            finish(traffic, record, "status", str(exc), exc.response.status_code)
        except ConnectionClosed as exc:
            finish(
                traffic, record, "closed", f"closed {exc.rcvd.code if exc.rcvd else 'without a frame'}: {exc}"
            )
        except Exception as exc:  # noqa: BLE001 - every failure is recorded and judged
            finish(traffic, record, *failure(exc))
        else:
            finish(traffic, record)
        if record.outcome != "intact":
            await asyncio.sleep(RETRY_AFTER_FAILURE_S)


def _prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(rng.randint(15, 40)))


def lost_words(prompt: str, text: str, whole: bool) -> str:
    """ "" if ``text`` is the prompt (or, for a cut stream, its start); else where it differs."""
    if text == prompt or (not whole and prompt.startswith(text)):
        return ""
    at = next(
        (i for i, (a, b) in enumerate(zip(prompt, text, strict=False)) if a != b), min(len(prompt), len(text))
    )
    said = f"expected {prompt[at : at + 40]!r}, got {text[at : at + 40]!r}"
    return f"differs at character {at}: {said} ({len(text)} of {len(prompt)} characters)"


async def _chat_pieces(
    client: httpx.AsyncClient, record: Record, traffic: Traffic, body: dict[str, object]
) -> tuple[list[str], bool] | None:
    """A streamed chat completion's content pieces, and whether ``[DONE]`` ended it (None:
    its answer was not a 200, as the record says). The record gets the longest wait for
    a piece, the first from the request on (``stall_s``), an error event, and data after
    ``[DONE]``."""
    pieces: list[str] = []
    done = False
    last = time.monotonic()  # a wait for the first piece counts too
    async with client.stream("POST", LLM_PREFIX + "/v1/chat/completions", json=body) as response:
        if not await _expect(record, response, traffic):
            return None
        try:
            async for event in _events(response):
                data = event.get("data", "")
                if done:
                    record.outcome, record.detail = "corrupt", f"data after [DONE]: {data[:200]}"
                    return pieces, done
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    record.outcome, record.detail = "error-event", json.dumps(chunk["error"])[:300]
                    break
                now = time.monotonic()
                record.stall_s = max(record.stall_s, now - last)
                last = now
                for choice in chunk.get("choices", ()):
                    pieces.append(choice.get("delta", {}).get("content") or "")
        except httpx.HTTPError as exc:
            record.outcome, record.detail = failure(exc)
    return pieces, done


def chat_exchange(traffic: Traffic) -> Exchange:
    """A streamed chat completion: the pieces, put together, must be the prompt."""

    async def exchange(client: httpx.AsyncClient, record: Record, rng: random.Random) -> None:
        prompt = _prompt(rng)
        body = {"model": ECHO_MODEL, "messages": [{"role": "user", "content": prompt}], "stream": True}
        read = await _chat_pieces(client, record, traffic, body)
        if read is None:
            return
        pieces, done = read
        if wrong := lost_words(prompt, "".join(pieces), whole=done):
            record.outcome, record.detail = "corrupt", wrong
        elif record.outcome == "intact" and not done:
            record.outcome, record.detail = "closed", "the stream ended without [DONE]"

    return exchange


#: What the soak asks SmolLM2, each a reply checked against its reference.
SMOL_PROMPTS = (
    "Write a long story about a lighthouse keeper and the sea.",
    "Describe a busy market in a small town on a Saturday morning.",
    "Explain how a bicycle works to a curious child.",
    "Tell me about the history of tea in a few paragraphs.",
)


def smol_references(base_url: str) -> dict[str, str]:
    """SmolLM2's greedy reply to each of SMOL_PROMPTS, made whole before any kill."""
    found = {}
    with httpx.Client(base_url=base_url, timeout=120) as client:
        for prompt in SMOL_PROMPTS:
            whole = {**smol_body(prompt), "stream": False}
            reply = client.post(LLM_PREFIX + "/v1/chat/completions", json=whole)
            reply.raise_for_status()
            found[prompt] = reply.json()["choices"][0]["message"]["content"]
    return found


def smol_body(prompt: str) -> dict[str, object]:
    """A greedy chat reply of SMOL_TOKENS tokens from the SmolLM2 model (``ignore_eos``)."""
    return {
        "model": SMOL_MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": SMOL_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }


def smol_exchange(traffic: Traffic, references: dict[str, str]) -> Exchange:
    """A greedy streamed chat reply from SmolLM2 on the transformers engine: put together,
    it must be the prompt's reference (its reply made before any kill), token for token."""

    async def exchange(client: httpx.AsyncClient, record: Record, rng: random.Random) -> None:
        prompt = rng.choice(sorted(references))
        read = await _chat_pieces(client, record, traffic, smol_body(prompt))
        if read is None:
            return
        pieces, done = read
        if wrong := lost_words(references[prompt], "".join(pieces), whole=done):
            record.outcome, record.detail = "corrupt", wrong
        elif record.outcome == "intact" and not done:
            record.outcome, record.detail = "closed", "the stream ended without [DONE]"

    return exchange


def completion_exchange(traffic: Traffic) -> Exchange:
    """A completion (whole), then the model list: both checked."""

    async def exchange(client: httpx.AsyncClient, record: Record, rng: random.Random) -> None:
        if rng.random() < 0.2:
            record.kind = "models"
            response = await client.get(LLM_PREFIX + "/v1/models")
            if await _expect(record, response, traffic):
                ids = [model["id"] for model in response.json()["data"]]
                if sorted(ids) != sorted([ECHO_MODEL, SMOL_MODEL]):
                    record.outcome, record.detail = "corrupt", f"models {ids}"
            return
        prompt = _prompt(rng)
        body = {"model": ECHO_MODEL, "prompt": prompt, "max_tokens": len(prompt.encode()) + 8}
        response = await client.post(LLM_PREFIX + "/v1/completions", json=body)
        if await _expect(record, response, traffic):
            if wrong := lost_words(prompt, response.json()["choices"][0]["text"], whole=True):
                record.outcome, record.detail = "corrupt", wrong

    return exchange
