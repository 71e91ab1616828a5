"""tk.testing.TestClient streams responses and opens WebSockets, on the local backend,
with the semantics the proxy has: headers before the body ends, leaving early is a
disconnect, close codes and refusals arrive as WebSocketDisconnect."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
from fastapi import APIRouter
from starlette.websockets import WebSocketDisconnect

import app_toolkit as tk
from app_toolkit.testing import TestClient
from tests.apps import basic
from tests.waiting import wait_for

router = APIRouter()
release = threading.Event()  # the local backend runs routes in this process
closed = threading.Event()


@router.get("/held")
async def held() -> tk.EventStream:
    async def events() -> AsyncIterator[str]:
        yield "headers and a first event go out now"
        while not release.is_set():
            await asyncio.sleep(0.01)
        yield "released"

    return tk.EventStream(events())


@router.get("/forever")
async def forever() -> tk.EventStream:
    async def events() -> AsyncIterator[int]:
        try:
            number = 0
            while True:
                number += 1
                yield number
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    return tk.EventStream(events())


def test_a_response_streams_while_the_app_still_produces(no_backend: None) -> None:
    release.clear()
    with TestClient(tk.App(router)) as client, client.stream("GET", "/held") as response:
        assert response.status_code == 200  # before the body has ended
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:")) == (
            "data: headers and a first event go out now"
        )
        release.set()
        assert next(line for line in lines if line.startswith("data:")) == "data: released"


def test_leaving_a_stream_early_disconnects(no_backend: None) -> None:
    closed.clear()
    with TestClient(tk.App(router)) as client:
        with client.stream("GET", "/forever") as response:
            data = [line for _, line in zip(range(12), response.iter_lines(), strict=False)]
            assert "data: 1" in data
        wait_for(closed.is_set, timeout_s=10)  # the app's generator was closed


def test_websockets(no_backend: None) -> None:
    with TestClient(basic.make_ws_app()) as client:
        with client.websocket_connect("/ws/echo") as socket:
            socket.send_text("hello")
            assert socket.receive_text() == "echo:hello"
            socket.send_bytes(b"\x01\x02")
            assert socket.receive_bytes() == b"\x02\x01"
            socket.send_text("close-4001")
            with pytest.raises(WebSocketDisconnect) as ended:
                socket.receive_text()
        assert (ended.value.code, ended.value.reason) == (4001, "asked to close")
        with pytest.raises(WebSocketDisconnect) as refused:
            client.websocket_connect("/ws/deny")
        assert refused.value.code != 1000
        with client.websocket_connect("/ws/who") as socket:  # usable again after a refusal
            socket.send_text("who")
            assert socket.receive_text()
