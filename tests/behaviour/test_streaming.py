"""Streaming: generator methods through handles, and streamed HTTP responses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import app_toolkit as tk
from tests.apps import basic
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for


def test_handle_streams_items_as_they_are_produced(toolkit: Toolkit) -> None:
    name = toolkit.name()
    toolkit.run(basic.make_token_app(), name=name, route_prefix="/tok")
    tokens = tk.get_deployment_handle("Tokens", name).options(stream=True)
    assert list(tokens.count.remote(4)) == [f"token-{i}" for i in range(4)]
    assert list(tokens.sync_count.remote(5)) == [0, 1, 4, 9, 16]

    async def read() -> list[str]:
        return [token async for token in tokens.count.remote(3)]

    assert asyncio.run(read()) == ["token-0", "token-1", "token-2"]

    failing = tokens.count.remote(5, fail_at=2)
    assert next(failing) == "token-0" and next(failing) == "token-1"
    with pytest.raises(RuntimeError, match="failed at 2"):
        next(failing)
    with pytest.raises(TypeError, match="is not a generator; call it without stream=True"):
        list(tokens.not_a_generator.remote())
    with pytest.raises(TypeError, match=r"is a generator; call it through handle.options\(stream=True\)"):
        tk.get_deployment_handle("Tokens", name).count.remote(2).result(timeout_s=10)


def test_stopping_a_stream_closes_the_generator_on_the_replica(toolkit: Toolkit, tmp_path: Path) -> None:
    name = toolkit.name()
    toolkit.run(basic.make_token_app(), name=name, route_prefix="/tok2")
    closed = tmp_path / "closed"
    stream = tk.get_deployment_handle("Tokens", name).options(stream=True).forever.remote(str(closed))
    assert [next(stream) for _ in range(3)] == [0, 1, 2]
    stream.cancel()
    wait_for(closed.exists, 20, "the replica to close the generator", interval_s=0.02)


def test_a_route_streams_a_handle_stream_over_http(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_token_app(), route_prefix="/http-tok")
    with toolkit.client() as client, client.stream("GET", "/http-tok/tokens/5") as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines == [f"token-{i}" for i in range(5)]

    # A streaming @batch method's results, through a handle stream and over HTTP: three
    # clients share a batch (within its 0.5 s wait), each gets its own steps, to its end.
    async def countdowns() -> list[list[str]]:
        async with toolkit.async_client() as client:
            answers = await asyncio.gather(*(client.get(f"/http-tok/countdown/{n}") for n in (1, 3, 2)))
        assert all(a.status_code == 200 for a in answers)
        return [a.text.split() for a in answers]

    steps = asyncio.run(countdowns())
    assert [[s.split("/")[0] for s in mine] for mine in steps] == [list("10"), list("3210"), list("210")]
    assert max(int(s.split("/")[1]) for mine in steps for s in mine) > 1  # some shared a batch


def test_a_result_that_cannot_be_sent_fails_the_call_instead_of_hanging(ray_toolkit: Toolkit) -> None:
    # Only Ray pickles results across processes; the local backend hands objects over.
    handle = ray_toolkit.run(as_deployment(basic.Unsendable).bind(), route_prefix=None)
    with pytest.raises(TypeError, match=r"Unsendable.frame returned a frame, which cannot be sent"):
        handle.frame.remote().result(timeout_s=20)
    items = handle.options(stream=True).items.remote()
    assert next(items) == 1
    with pytest.raises(TypeError, match=r"Unsendable.items returned a generator, which cannot be sent"):
        next(items)


def test_a_result_the_caller_cannot_load_fails_that_call_and_no_other(ray_toolkit: Toolkit) -> None:
    handle = ray_toolkit.run(as_deployment(basic.Unsendable).bind(), route_prefix=None)
    with pytest.raises(TypeError, match=r"reply could not be decoded here \(ImportError: No module"):
        handle.stranger.remote().result(timeout_s=20)
    # The connection it came on still carries calls.
    items = handle.options(stream=True).items.remote()
    assert next(items) == 1
