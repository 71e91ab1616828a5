"""@batch inside a deployment, called through handles, on both backends."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.apps import basic
from tests.conftest import Toolkit


def test_concurrent_handle_calls_are_batched_per_replica(toolkit: Toolkit) -> None:
    name = toolkit.name()
    handle = toolkit.run(basic.BatchedSquare.bind(), name=name, route_prefix=None)

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
