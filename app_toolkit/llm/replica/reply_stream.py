"""One reply's stream, as the model's replica sends it: token ids to text pieces, cut at
stop strings, shaped into tool calls where asked, paced, and counted in the metrics.

``server.py`` makes one per ``generate`` call, once the prompt is built and fits.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING

import app_toolkit as tk
from app_toolkit.llm import metrics
from app_toolkit.llm.detokenize import Detokenizer, StopFilter
from app_toolkit.llm.engine import EngineRequest, Logprobs, Sampling, TextEngine
from app_toolkit.llm.events import Delta, Generation, TokenLogprob
from app_toolkit.llm.replica.shaping import Structure

if TYPE_CHECKING:
    from app_toolkit.llm.tool_calls import Fragment

#: Prompt tokens decoded with a reply's first tokens, so its first piece keeps a leading space.
CONTEXT_TOKENS = 4
#: The lowest log-probability shown (vLLM's stand-in for minus infinity; JSON has none).
LOWEST_LOGPROB = -9999.0


class ReplyStream:
    """One reply, from the engine's token ids to the deltas its caller gets."""

    def __init__(
        self,
        model: str,
        engine: TextEngine,
        prompt: list[int],
        sampling: Sampling,
        structure: Structure | None,
        generation: Generation,
        interval_s: float,
        adapter: str = "",
        so_far: tuple[int, ...] = (),
    ) -> None:
        self._model = model
        self._adapter = adapter
        self._engine = engine
        self._prompt = prompt
        self._sampling = sampling
        self._structure = structure
        self._generation = generation
        self._interval_s = interval_s
        #: The reply's tokens so far, read on its lost replica (their text was sent from there).
        self._so_far = so_far
        self.produced = 0
        self.cached = 0  # prompt tokens the engine found in its prefix cache

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        detokenizer = _detokenizer(self._engine, self._prompt, self._generation)
        stops = StopFilter(self._generation.stops, self._generation.include_stop_str_in_output)
        structure = self._structure
        held: list[Delta] = []
        flushed = 0.0
        sent = False  # the first piece goes at once; the pace applies after it
        started = time.monotonic()
        last = started
        finish = "stop"
        outcome = "cancelled"
        constraint = structure.constraint if structure is not None else None
        ended_by: int | None = None  # the token that ended the reply, if one did
        received_at = self._generation.received_at
        continued = self._generation.continued is not None  # its first token was timed where it began
        if received_at and not continued:
            metrics.FRAMEWORK_TIME.observe(max(0.0, time.time() - received_at), self._model)
        metrics.PROMPT_TOKENS.inc(self._model, amount=len(self._prompt))
        model = self._model
        # A continued reply reads its tokens so far as its lost replica did, and sends none
        # of what they made again: the state after them (text held back for a stop string
        # or a cut character, the grammar, a tool call half made) is where the rest goes on.
        unread: list[int] = []  # the tokens whose text the structure has not read yet
        for token in self._so_far:
            self.produced += 1
            unread.append(token)
            if constraint is not None:
                constraint.accept(token)
            text = stops.feed(detokenizer.feed(token), self.produced > self._sampling.min_tokens)
            if text:
                self._shaped(text, unread)
                unread = []
        carried = self.produced

        def on_slot() -> None:
            metrics.QUEUE_TIME.observe(time.monotonic() - started, model)

        caching = self._engine.capabilities.prefix_cache

        def on_prompt(cached: int) -> None:
            self.cached = cached
            if caching:  # an engine without a prefix cache has no hit rate to show
                metrics.PREFIX_CACHE_QUERIES.inc(model, amount=len(self._prompt))
                metrics.PREFIX_CACHE_HITS.inc(model, amount=cached)

        request = EngineRequest(
            self._prompt,
            self._sampling,
            constraint,
            self._adapter,
            on_slot,
            on_prompt,
            produced=self._so_far,
            priority=tk.get_request_priority(),
        )
        tokens = self._engine.generate(request)
        logprobs: list[TokenLogprob] = []  # of the tokens since the last piece sent
        read: list[int] = []  # the tokens read since the last piece sent (Delta.tokens)
        try:
            async for produced in tokens:
                token = produced.id
                unread.append(token)
                read.append(token)
                if produced.logprobs is not None:
                    logprobs.append(self._shown(token, produced.logprobs))
                self.produced += 1
                now = time.monotonic()
                if self.produced == 1 + carried:
                    if not continued:
                        first_s = time.time() - received_at if received_at else now - started
                        metrics.TIME_TO_FIRST_TOKEN.observe(first_s, self._model)
                else:
                    metrics.TIME_PER_OUTPUT_TOKEN.observe(now - last, self._model)
                last = now
                if produced.ends:  # an end of sequence or a stop token id: counted, not shown
                    ended_by = token  # (unless include_stop_str_in_output: shown, as vLLM shows it)
                    if not self._generation.include_stop_str_in_output:
                        continue
                text = stops.feed(detokenizer.feed(token), self.produced > self._sampling.min_tokens)
                if text:
                    held.extend(self._shaped(text, unread))
                    unread = []
                if stops.stopped:
                    break
                # A token that ends the reply (shown, with include_stop_str_in_output) goes
                # with its finish: no piece carries it, so no continuation reads past it.
                if held and not produced.ends and (not sent or now - flushed >= self._interval_s):
                    yield _joined(held, logprobs, self.produced, tuple(read))
                    held, logprobs, read = [], [], []
                    flushed = now
                    sent = True
            else:
                if (
                    ended_by is None
                    and self.produced >= self._sampling.max_tokens
                    and not (constraint is not None and constraint.finished)
                ):
                    finish = "length"
            tail = stops.feed(detokenizer.flush()) + stops.flush() if not stops.stopped else ""
            if tail:
                held.extend(self._shaped(tail, unread))
                unread = []
            if structure is not None:
                held.extend(structure.finish(unread))
                finish = structure.finish_reason(finish)
            outcome = finish
        except Exception:
            outcome = "error"
            raise
        finally:
            await tokens.aclose()  # stops the engine's work on it now, not when collected
            metrics.GENERATION_TOKENS.inc(self._model, amount=self.produced - carried)
            metrics.REPLIES.inc(self._model, outcome)
        # What ended it, as vLLM's stop_reason says: a stop string, a stop token id (not
        # the end of sequence), else None.
        reason: str | int | None = stops.found
        if ended_by is not None and ended_by in self._sampling.stop_token_ids:
            reason = ended_by
        # The text held to the end (and a grammar's last fragments) goes with the finish:
        # a reply whose replica is lost is either finished, or continued from its tokens.
        rest = _joined(held, logprobs, self.produced, ()) if held else Delta(logprobs=tuple(logprobs))
        yield Delta(
            text=rest.text,
            tool_calls=rest.tool_calls,
            reasoning=rest.reasoning,
            prompt_tokens=len(self._prompt),
            completion_tokens=self.produced,
            finish_reason=finish,
            logprobs=rest.logprobs,
            stop_reason=reason,
            reasoning_tokens=None if structure is None else structure.reasoning_tokens(),
        )

    def _shown(self, token: int, logprobs: Logprobs) -> TokenLogprob:
        """A token's log-probabilities as the client reads them: tokens as text."""
        raw = self._engine.token_bytes
        mine = raw(token)
        return TokenLogprob(
            _text(mine),
            max(LOWEST_LOGPROB, logprobs.logprob),
            mine,
            tuple(
                (_text(raw(other)), max(LOWEST_LOGPROB, value), raw(other)) for other, value in logprobs.top
            ),
        )

    def _shaped(self, text: str, token_ids: Sequence[int]) -> list[Delta]:
        if self._structure is None:
            return [Delta(text=text, completion_tokens=self.produced)]
        return self._structure.feed(text, token_ids)


def _detokenizer(engine: TextEngine, prompt: Sequence[int], generation: Generation) -> Detokenizer:
    """The reply's detokenizer, as vLLM's request fields ask: special tokens skipped (the
    default) or their text shown, and then two in a row joined without a space unless
    ``spaces_between_special_tokens`` (which, as in vLLM, changes nothing while they are
    skipped)."""
    context = prompt[-CONTEXT_TOKENS:]
    if generation.skip_special_tokens:
        return Detokenizer(engine.decode, context)

    def decode(token_ids: Sequence[int]) -> str:
        return engine.decode(token_ids, skip_special_tokens=False)

    unspaced = None if generation.spaces_between_special_tokens else engine.added_tokens()
    return Detokenizer(decode, context, unspaced=unspaced)


def _text(raw: bytes) -> str:
    """A token's text as logprobs show it: its bytes, a cut character as U+FFFD, special
    tokens and SentencePiece's spaces kept."""
    return raw.decode(errors="replace")


def _joined(deltas: list[Delta], logprobs: list[TokenLogprob], produced: int, read: tuple[int, ...]) -> Delta:
    """Pieces held by the stream's pace, sent as one with the log-probabilities of their
    tokens, the count of tokens produced so far and the ids of those read since the last
    piece: text and reasoning joined, and tool-call fragments of one call (one ``index``)
    merged into one, as OpenAI's clients expect a chunk's."""
    if len(deltas) == 1 and len(deltas[0].tool_calls) < 2:
        one = deltas[0]  # a piece of text, reasoning or one tool call (shaping.py, parsers.py)
        return Delta(
            text=one.text,
            tool_calls=one.tool_calls,
            reasoning=one.reasoning,
            logprobs=tuple(logprobs),
            completion_tokens=produced,
            tokens=read,
        )
    calls: dict[int, Fragment] = {}
    for fragment in (c for d in deltas for c in d.tool_calls):
        merged = calls.get(fragment["index"])
        if merged is None:
            calls[fragment["index"]] = {**fragment, "function": dict(fragment.get("function") or {})}
            continue
        arguments = (fragment.get("function") or {}).get("arguments") or ""
        merged["function"]["arguments"] = (merged["function"].get("arguments") or "") + arguments
    return Delta(
        text="".join(d.text for d in deltas),
        reasoning="".join(d.reasoning for d in deltas),
        tool_calls=tuple(calls[i] for i in sorted(calls)),
        logprobs=tuple(logprobs),
        completion_tokens=produced,
        tokens=read,
    )
