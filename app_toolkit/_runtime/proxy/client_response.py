"""Writing a response to the client: the one way every path does it (the proxy relaying a
replica's answer, ``forward.py``; an ingress replica's app answering its own client,
``direct.py``).

The request id goes into the head; a whole response's head and body leave in one write
where our HTTP protocol lets them; a stream's chunks leave as they come, those that came
together in one write (each still its own chunk); a stream is counted (open streams,
time to its first chunk, chunks); and the request's state says what was sent (status,
route, started, finished) for its access line and metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from starlette.types import Message, Send

from app_toolkit._runtime.proxy import stream_metrics
from app_toolkit._runtime.proxy.request_state import RequestState
from app_toolkit._runtime.proxy.scope import with_request_id


class ClientResponse:
    """One request's response to its client."""

    __slots__ = ("_send", "_state", "_labels", "_first")

    def __init__(self, send: Send, state: RequestState) -> None:
        self._send = send
        self._state = state
        self._labels: tuple[str, str] | None = None  # set while a stream is open
        self._first = True

    async def whole(
        self,
        status: int,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        route: str,
        start: Message | None = None,
    ) -> None:
        """A complete response: its head and body in one write. ``start``: the app's own
        ``http.response.start``, whose other keys (``trailers``) are kept."""
        state = self._state
        state.route = route
        state.started = state.finished = True
        state.status = status
        head = _head(status, headers, state.request_id, start)
        link = state.link
        if link is not None:
            link.join_head_and_body()
        try:
            await self._send(head)
            await self._send({"type": "http.response.body", "body": body})
        finally:
            if link is not None:
                link.release()

    async def stream(
        self,
        status: int,
        headers: Iterable[tuple[bytes, bytes]],
        route: str,
        first: bytes | None = None,
        start: Message | None = None,
    ) -> None:
        """A streamed response's head, with its first chunk if that is here (one write);
        ``start`` as for :meth:`whole`."""
        state = self._state
        state.route = route
        state.started = True
        state.status = status
        head = _head(status, headers, state.request_id, start)
        self._labels = (state.app, state.prefix + route if route else state.prefix)
        stream_metrics.OPEN.inc(state.app, "stream")
        if first is None:
            await self._send(head)
            return
        link = state.link
        if link is not None:
            link.gather_writes()
        try:
            await self._send(head)
            await self._send({"type": "http.response.body", "body": first, "more_body": True})
        finally:
            if link is not None:
                link.release()
        self._counted((first,))

    async def chunks(self, pieces: Sequence[bytes], last: bool) -> None:
        """Pieces of the stream's body that are here, in one write; ``last``: the final one
        is among them (the response is then complete)."""
        state = self._state
        state.finished = last
        link = state.link
        if link is not None and len(pieces) > 1:
            link.gather_writes()
        try:
            final = len(pieces) - 1
            for index, piece in enumerate(pieces):
                more = not (last and index == final)
                await self._send({"type": "http.response.body", "body": piece, "more_body": more})
        finally:
            if link is not None and len(pieces) > 1:
                link.release()
        self._counted(pieces)
        if last:
            self.close()

    def _counted(self, pieces: Sequence[bytes]) -> None:
        labels = self._labels
        if labels is None:
            return
        sent = sum(1 for piece in pieces if piece)
        if not sent:
            return
        if self._first:
            self._first = False
            stream_metrics.FIRST_CHUNK.observe(time.perf_counter() - self._state.arrived, *labels)
        stream_metrics.CHUNKS.inc(*labels, amount=sent)

    def close(self) -> None:
        """The stream ended (or failed): it is no longer open."""
        if self._labels is not None:
            stream_metrics.OPEN.dec(self._state.app, "stream")
            self._labels = None


def _head(
    status: int, headers: Iterable[tuple[bytes, bytes]], request_id: str, start: Message | None
) -> Message:
    head = {
        "type": "http.response.start",
        "status": status,
        "headers": with_request_id(headers, request_id),
    }
    return head if start is None else {**start, **head}
