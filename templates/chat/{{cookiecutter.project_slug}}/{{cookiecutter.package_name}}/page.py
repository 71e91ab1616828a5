"""The chat page at ``/``, its sign-in (``/api/session``, with API keys on) and the
resumable reply API it uses (``/api/replies``). Its routes are open to the front
(``@tk.open_route``): the page's requests carry its sign-in cookie, not a key, and are let
in as the cookie's key here (``access.py``)."""

from __future__ import annotations

import dataclasses
import html
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import app_toolkit as tk
from app_toolkit.llm import ANSWERED, OpenAIError, as_openai_error
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse

from .access import COOKIE, Access
from .replies import ReplyEvent
from .schemas import ChatCompletionRequest
from .settings import Settings

ASSETS = {"chat.js": "text/javascript", "chat.css": "text/css", "favicon.svg": "image/svg+xml"}
RECONNECT_MS = 500  # how soon a browser reconnects a dropped reply


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("page", name).read_text(encoding="utf-8")


def build_router(
    settings: Settings, replies_app: tk.Application, model_app: tk.Application, access: Access
) -> APIRouter:
    router = APIRouter()
    files = {name: _read(name) for name in ["index.html", *ASSETS]}  # read once, at build

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    @tk.open_route
    async def page() -> HTMLResponse:
        return HTMLResponse(files["index.html"].replace("__MODEL__", html.escape(settings.model_name)))

    @router.get("/static/{name}", include_in_schema=False)
    @tk.open_route
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, f"No file {name!r}")
        return Response(files[name], media_type=ASSETS[name], headers={"Cache-Control": "no-cache"})

    @router.get("/favicon.ico", include_in_schema=False)
    @tk.open_route
    async def favicon() -> Response:  # browsers ask for it on pages that name no icon
        return Response(files["favicon.svg"], media_type=ASSETS["favicon.svg"])

    @router.get("/api/session")
    @tk.open_route
    async def session(owner: str = Depends(access.identified)) -> dict[str, object]:
        """Who the page is signed in as: 401 when keys are on and it is not."""
        return {"keys": bool(owner), "owner": owner}

    @router.post("/api/session", status_code=204)
    async def sign_in(request: Request) -> Response:
        """Sign the page in with the API key it sends (``Authorization: Bearer``, checked
        at the front): it gets a cookie naming the key, and never keeps the key."""
        owner = tk.api_key_name(request)
        if owner is None:
            raise OpenAIError(404, "This server asks for no API key.", "invalid_request_error")
        response = Response(status_code=204)
        response.set_cookie(
            COOKIE,
            access.sessions.issue(owner),
            max_age=int(settings.session_ttl_s),
            httponly=True,
            samesite="strict",
            secure=settings.secure_cookies,
        )
        return response

    @router.delete("/api/session", status_code=204)
    @tk.open_route
    async def sign_out() -> Response:
        response = Response(status_code=204)
        response.delete_cookie(COOKIE, httponly=True, samesite="strict", secure=settings.secure_cookies)
        return response

    @router.post("/api/replies", status_code=201)
    @tk.open_route
    async def start_reply(
        request: ChatCompletionRequest,
        owner: str = Depends(access.admitted),
        replies: tk.DeploymentHandle = tk.Depends(replies_app),
    ) -> dict[str, str]:
        """Start generating a reply; read it from ``/api/replies/{id}/events``."""
        # Only its caller can read or stop it; its calls go to one Replies replica (the one
        # generating it).
        reply_id = access.replies.issue(owner)
        generation = dataclasses.replace(request.generation(settings), owner=owner)
        try:
            await replies.options(shard_key=reply_id).start.remote(reply_id, generation)
        except ANSWERED as exc:
            raise as_openai_error(exc) from None
        return {"id": reply_id}

    @router.get("/api/replies/{reply_id}/events")
    @tk.open_route
    async def reply_events(
        reply_id: str,
        after: str = Query("", max_length=64, description="Send the events after the one with this id."),
        last_event_id: str | None = Header(None, max_length=64),
        owner: str = Depends(access.identified),
        replies: tk.DeploymentHandle = tk.Depends(replies_app),
    ) -> tk.EventStream:
        """The reply as SSE; a reconnecting EventSource resumes after its ``Last-Event-ID``."""
        if not access.replies.owns(reply_id, owner):
            raise _no_reply(reply_id)
        handle = replies.options(method_name="events", stream=True, shard_key=reply_id)
        stream = handle.remote(reply_id, last_event_id or after)
        try:
            first: ReplyEvent | None = await anext(stream, None)
        except ANSWERED as exc:
            raise as_openai_error(exc) from None
        # The page resumes after its Last-Event-ID through any replica: a draining one need
        # not keep the stream open (the page reconnects at its drain event).
        return tk.EventStream(_sse(first, stream), ids=False, end_at_drain=True)

    @router.post("/api/replies/{reply_id}/stop", status_code=204)
    @tk.open_route
    async def stop_reply(
        reply_id: str,
        owner: str = Depends(access.identified),
        replies: tk.DeploymentHandle = tk.Depends(replies_app),
    ) -> Response:
        """Stop generating: the model ends the reply and frees its place in the batch."""
        if not access.replies.owns(reply_id, owner):
            raise _no_reply(reply_id)
        if not await replies.options(shard_key=reply_id).stop.remote(reply_id):
            raise _no_reply(reply_id)
        return Response(status_code=204)

    @router.get("/api/stats")
    @tk.open_route
    async def stats(
        owner: str = Depends(access.identified), model: tk.DeploymentHandle = tk.Depends(model_app)
    ) -> dict[str, int]:
        """Counters of the model replica that answers (replies by outcome, tokens produced)."""
        counters: dict[str, int] = await model.stats.remote()
        return counters

    return router


def _no_reply(reply_id: str) -> OpenAIError:
    """A reply that does not exist, or is not the caller's: the same answer for both."""
    return OpenAIError(404, f"No reply {reply_id[:100]!r}.", "invalid_request_error", "reply_not_found")


async def _sse(
    first: ReplyEvent | None, stream: tk.DeploymentResponseGenerator[ReplyEvent]
) -> AsyncIterator[Any]:
    try:
        event = first
        retry: dict[str, int] = {"retry": RECONNECT_MS}  # how soon the browser reconnects if the line drops
        while event is not None:
            # An event without an id (a reply lost with its process) must not reset the
            # browser's Last-Event-ID: it is the last one anyway.
            fields = {"id": event.id} if event.id else {}
            yield {**fields, "event": event.kind, "data": event.data, **retry}
            retry = {}
            event = await anext(stream, None)
    finally:
        stream.cancel()  # only the reading stops; the reply goes on for a reconnecting reader
