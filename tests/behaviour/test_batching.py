"""@batch inside a deployment, called through handles, on both backends."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.apps import basic, serve_compat
from tests.conftest import Toolkit
from tests.deployments import as_deployment


def test_concurrent_handle_calls_are_batched_per_replica(toolkit: Toolkit) -> None:
    name = toolkit.name()
    handle = toolkit.run(as_deployment(basic.BatchedSquare).bind(), name=name, route_prefix=None)

    async def burst() -> list[Any]:
        calls = [handle.square.remote(x) for x in [*range(1, 16), -3]]
        return list(await asyncio.gather(*calls, return_exceptions=True))

    outcomes = asyncio.run(burst())
    *squares, negative = outcomes
    assert [o["square"] for o in squares] == [x * x for x in range(1, 16)]
    assert isinstance(negative, ValueError) and "-3 is negative" in str(negative)
    sizes = [o["batch"] for o in squares]
    # user_config raised max_batch_size from 4 to 8 through reconfigure()
    assert max(sizes) > 4 and max(sizes) <= 8


def test_batched_function_deployment_returns_each_callers_item(toolkit: Toolkit) -> None:
    # Ray Serve's idiom: @serve.deployment over @serve.batch over a plain async function.
    handle = toolkit.run(serve_compat.batched_tag.bind(), route_prefix=None)
    responses = [handle.remote(x) for x in range(8)]
    results = [response.result(timeout_s=20) for response in responses]
    assert [x for x, _ in results] == list(range(8))
    assert all(1 <= size <= 4 for _, size in results)
    assert max(size for _, size in results) > 1  # concurrent calls did share batches
