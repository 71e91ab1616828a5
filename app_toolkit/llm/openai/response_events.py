"""A streamed ``/v1/responses`` reply's events: the model's deltas as OpenAI's events
(``response.created`` ... ``response.completed``), each numbered by its
``sequence_number`` from 0, its reasoning and its message as output items of their own;
and those events as SSE."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from sse_starlette import ServerSentEvent

import app_toolkit as tk
from app_toolkit.llm.errors import ANSWERED, stream_error
from app_toolkit.llm.events import Delta
from app_toolkit.llm.openai.replies import Stream
from app_toolkit.llm.openai.responses import Event, Reply
from app_toolkit.streaming import OpenAIErrorEvent

logger = logging.getLogger("app_toolkit.llm")


async def produced(reply: Reply, stream: Stream) -> AsyncIterator[Event]:
    """The response's events as the model's deltas come; ``reply`` follows along. The
    reasoning (a reasoning parser's) is an item of its own, opened at its first piece and
    done when the message's first piece comes, as vLLM's server sends them; the message is
    sent even when empty. A reply cut off ends with OpenAI's ``error`` event (the model's
    replica went away: retry), a failure with ``response.failed``."""
    event = reply.event
    items = _Items(reply)
    yield event("response.created", response=reply.response())
    yield event("response.in_progress", response=reply.response())
    try:
        async for delta in stream:
            # vLLM's reasoning parsers send the reasoning before the answer: a piece of it
            # after the answer began (which none sends) would have no item left to go in.
            if delta.reasoning and not items.message_open:
                for sent in items.open_reasoning():
                    yield sent
                reply.reasoning.append(delta.reasoning)
                yield event("response.reasoning_text.delta", **items.where_reasoning, delta=delta.reasoning)
            if delta.text:
                for sent in items.open_message():
                    yield sent
                reply.text.append(delta.text)
                yield event(
                    "response.output_text.delta", **items.where_message, delta=delta.text, logprobs=[]
                )
            if delta.finish_reason is not None:
                reply.end(delta)
    except ANSWERED as exc:
        logger.warning("Response %s was cut off: %s", reply.id, exc)
        yield reply.error_event(stream_error(exc))
        return
    except Exception:
        logger.exception("Response %s failed", reply.id)
        request_id = tk.get_request_id()
        reply.fail(f"The model failed (request id {request_id}).")
        yield event("response.failed", response={**reply.response(), "output": [], "usage": None})
        return
    finally:
        stream.cancel()  # ended early (a stream dropped, the ingress stopping): the model stops too
    if not reply.done:
        reply.end(Delta(completion_tokens=reply.completion_tokens, finish_reason="stop"))
    for sent in items.open_message():
        yield sent
    where = items.where_message
    yield event("response.output_text.done", **where, text="".join(reply.text), logprobs=[])
    yield event("response.content_part.done", **where, part=reply.part())
    yield event(
        "response.output_item.done", output_index=where["output_index"], item=reply.message("completed")
    )
    yield event(f"response.{reply.status}", response=reply.response())


class _Items:
    """The output items of a streamed response, opened as their first piece comes: the
    reasoning (index 0), then the message (index 1 after reasoning, else 0)."""

    def __init__(self, reply: Reply) -> None:
        self._reply = reply
        self.reasoning_open = False
        self.message_open = False
        self.where_reasoning: dict[str, str | int] = {
            "item_id": reply.reasoning_id,
            "output_index": 0,
            "content_index": 0,
        }
        self.where_message: dict[str, str | int] = {
            "item_id": reply.message_id,
            "output_index": 0,
            "content_index": 0,
        }

    def open_reasoning(self) -> list[Event]:
        """The reasoning item's opening events (none once it is open)."""
        if self.reasoning_open:
            return []
        self.reasoning_open = True
        event, where = self._reply.event, self.where_reasoning
        return [
            event(
                "response.output_item.added", output_index=0, item=self._reply.reasoning_item("in_progress")
            ),
            event("response.content_part.added", **where, part={"type": "reasoning_text", "text": ""}),
        ]

    def open_message(self) -> list[Event]:
        """The reasoning item's closing events if it is open, then the message's opening
        events (none once it is open)."""
        if self.message_open:
            return []
        self.message_open = True
        reply, event, sent = self._reply, self._reply.event, []
        if self.reasoning_open:
            where = self.where_reasoning
            text = "".join(reply.reasoning)
            sent += [
                event("response.reasoning_text.done", **where, text=text),
                event("response.content_part.done", **where, part=reply.reasoning_part()),
                event("response.output_item.done", output_index=0, item=reply.reasoning_item("completed")),
            ]
            self.where_message["output_index"] = 1
        where = self.where_message
        sent += [
            event(
                "response.output_item.added",
                output_index=where["output_index"],
                item=reply.message("in_progress"),
            ),
            event(
                "response.content_part.added",
                **where,
                part={"type": "output_text", "text": "", "annotations": []},
            ),
        ]
        return sent


# --8<-- [start:streamed]
def streamed(events: AsyncIterator[Event], next_number: Callable[[], int]) -> tk.EventStream:
    """The events as SSE, each named by its ``type``; one still open at the ingress
    replica's drain deadline ends with the error that says retry, numbered ``next_number()``."""

    async def sent() -> AsyncIterator[ServerSentEvent]:
        try:
            async for kind, data in events:
                yield ServerSentEvent(data=data, event=kind)
        finally:
            close = getattr(events, "aclose", None)  # the client left: what it read stops now
            if close is not None:
                await close()

    return tk.EventStream(
        sent(),
        ids=False,
        final_event=lambda: OpenAIErrorEvent.restarting().responses(next_number()),
        end_at_drain=False,
    )


# --8<-- [end:streamed]
