"""The model pool: a deployment of its own, autoscaled on its own load (scaling.py), called
through a streaming handle by the HTTP routes and the reply store."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import app_toolkit as tk
from app_toolkit.llm import Delta, EngineStopped, OpenAIError, StopFilter

from . import metrics
from .engines import Engine, make_engine
from .scaling import replica_metrics
from .schemas import Generation
from .settings import Settings


@tk.deployment(
    num_replicas="auto",  # build_app gives the pool its autoscaling_config (scaling.py)
    max_ongoing_requests=32,  # the local model: max_batch_size (build_app)
    max_queued_requests=64,
    ray_actor_options={"num_cpus": 1},  # torch gets as many threads as the actor reserves CPUs
)
class ChatModel:
    """Owns one engine per replica and streams replies as :class:`Delta` items."""

    def __init__(self, settings: Settings) -> None:
        self._engine: Engine = make_engine(settings)
        self._engine.load()  # the replica turns RUNNING once the model is in memory
        self._scale_wait_s = settings.scale_wait_s
        self._replies = {"started": 0, "finished": 0, "stopped": 0, "failed": 0}

    async def __del__(self) -> None:
        """The replica stops (awaited by the toolkit, as by Ray Serve): the engine lets go
        of the model (the local decoder's task ends) or of its upstream connections."""
        await self._engine.close()

    async def generate(self, generation: Generation) -> AsyncIterator[Delta]:
        """The first item counts the prompt; then text pieces; the last says why it ended.

        Raises :class:`OpenAIError` (400) before any item when the prompt does not fit.
        """
        prompt_tokens = self._engine.count_prompt(generation)
        window = self._engine.context_window
        if prompt_tokens >= window:
            raise OpenAIError(
                400,
                f"The conversation takes {prompt_tokens} tokens; this model's context window is {window}. "
                "Shorten the messages.",
                "invalid_request_error",
                "context_length_exceeded",
            )
        max_tokens = min(generation.max_tokens, window - prompt_tokens)
        limited = dataclasses.replace(generation, max_tokens=max_tokens)
        self._replies["started"] += 1
        yield Delta(prompt_tokens=prompt_tokens)
        stops = StopFilter(generation.stop)
        produced = 0
        finish = "stop"
        outcome = "failed"
        started = first = last = time.monotonic()
        pieces = self._engine.stream(limited)
        try:
            async for piece in pieces:
                produced += 1
                now = time.monotonic()
                if produced == 1:
                    first = now
                    metrics.TIME_TO_FIRST_TOKEN.observe(now - started)
                else:
                    metrics.INTER_TOKEN_LATENCY.observe(now - last)
                last = now
                text = stops.feed(piece)
                if text:
                    yield Delta(text=text)
                if stops.stopped:
                    break
                if produced >= max_tokens:
                    finish = "length"
            tail = stops.flush()
            if tail:
                yield Delta(text=tail)
            outcome = "finished"
        except (GeneratorExit, asyncio.CancelledError):
            outcome = "stopped"
            if produced:
                metrics.CANCELLATIONS.inc("decode")
            elif not self._engine.counts_cancellations:  # the local engine tells queued from prefill
                metrics.CANCELLATIONS.inc("prefill")
            raise
        except EngineStopped:  # the replica stops under it: the caller continues it elsewhere
            outcome = "stopped"
            raise
        finally:
            await pieces.aclose()  # stops the engine's generation now, not when collected
            self._replies[outcome] += 1
            metrics.REPLIES.inc(outcome)
            if produced > 1 and last > first:
                metrics.TOKENS_PER_SECOND.observe((produced - 1) / (last - first))
            # A continued reply's prompt was counted when it began: its tokens are not charged twice.
            self._charge(generation.owner, 0 if generation.prefix else prompt_tokens, produced)
        yield Delta(prompt_tokens=prompt_tokens, completion_tokens=produced, finish_reason=finish)

    def _charge(self, owner: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Count tokens used: in the chat's metrics, and against the key's tokens limit
        (``tokens_per_window`` of its entry in the toolkit's API keys)."""
        metrics.TOKENS.inc(owner or "anonymous", "prompt", amount=prompt_tokens)
        metrics.TOKENS.inc(owner or "anonymous", "completion", amount=completion_tokens)
        tk.charge_tokens(owner, prompt_tokens + completion_tokens)  # (nothing for "": keys off)

    async def relay(self, body: dict[str, Any], owner: str = "") -> AsyncIterator[dict[str, Any]]:
        """The upstream's answer to a whole chat completion request, as it came: one
        completion, or its chunks when ``body`` asks for a stream (``openai`` backend).
        The usage the upstream reports (in the completion, or a streamed usage chunk) is
        charged to ``owner``."""
        relay = getattr(self._engine, "relay", None)
        if relay is None:
            raise OpenAIError(400, "Only the openai backend relays requests.", "invalid_request_error")
        self._replies["started"] += 1
        answers = relay(body)
        try:
            async for answer in answers:
                usage = answer.get("usage") if isinstance(answer, dict) else None
                if isinstance(usage, dict):
                    self._charge(
                        owner, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
                    )
                yield answer
        except (GeneratorExit, asyncio.CancelledError):
            self._replies["stopped"] += 1
            raise
        finally:
            await answers.aclose()  # the upstream request ends with the caller's
        self._replies["finished"] += 1

    # --8<-- [start:stats]
    async def record_autoscaling_stats(self) -> dict[str, float]:
        """This replica's load, for the pool's autoscaling policy (scaling.py): computed
        from what the engine holds, on the event loop, without waiting for anything."""
        return replica_metrics(self._engine.current_load(), self._scale_wait_s)

    # --8<-- [end:stats]

    async def stats(self) -> dict[str, int]:
        """This replica's counters: replies by outcome, and the engine's ``active``/``tokens``."""
        return {**self._replies, **self._engine.stats()}
