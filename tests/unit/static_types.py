"""What mypy infers for users of the public API: checked by ``mypy`` in ``make test`` (its
files include tests/), never run by pytest.

``assert_type`` fails the type check when the inferred type differs; a ``type: ignore``
names an error that must happen (strict mypy reports an ignore that is not needed).
"""

from __future__ import annotations

from typing import Any, assert_type

import app_toolkit as tk
from app_toolkit.handle import DeploymentHandle, StreamingDeploymentHandle
from app_toolkit.responses import DeploymentResponse, DeploymentResponseGenerator


async def handles_say_what_remote_returns(handle: tk.DeploymentHandle) -> None:
    assert_type(handle.remote(1), DeploymentResponse[Any])
    assert_type(handle.embed.remote("x"), DeploymentResponse[Any])
    streaming = handle.options(stream=True)
    assert_type(streaming.remote(), DeploymentResponseGenerator[Any])
    assert_type(streaming.tokens.remote("x"), DeploymentResponseGenerator[Any])
    async for item in streaming.tokens.remote("x"):
        assert_type(item, Any)
    # A bare DeploymentHandle: strict mypy accepts it.
    assert_type(handle.options(method_name="embed"), DeploymentHandle[Any])
    assert_type(handle.options(session_id="s"), DeploymentHandle[Any])
    everywhere = handle.broadcast("reload", "adapter", revision=3)
    assert_type(everywhere, tk.DeploymentBroadcastResponse)
    assert_type(everywhere.results(timeout_s=5), list[Any])
    assert_type(await everywhere.results_async(return_exceptions=True), list[Any])


class Model: ...


def a_typed_handle_stays_typed_when_streaming(model: tk.DeploymentHandle[Model]) -> None:
    # Ray Serve's annotation: DeploymentHandle[Model].
    assert_type(model.options(stream=True), StreamingDeploymentHandle[Model])


class Embedder:
    @tk.batch(max_batch_size=8)
    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [[0.0] for _ in texts]


@tk.batch()
async def lengths(texts: list[str]) -> list[int]:
    return [len(t) for t in texts]


async def a_batched_function_takes_one_item_and_returns_one_result(embedder: Embedder) -> None:
    assert_type(await embedder.embed("x"), list[float])
    assert_type(await lengths("x"), int)
    await embedder.embed(3)  # type: ignore[arg-type]  # one text, not an int


def the_replica_context_types_ray_serves_fields_and_the_id_is_still_a_string() -> None:
    context = tk.get_replica_context()
    assert_type(context.replica_id.unique_id, str)
    assert_type(context.replica_id.deployment_id.app_name, str)
    assert_type(context.replica_tag, str)
    assert_type(context.code_version, str | None)
    replica_id: str = context.replica_id  # what the toolkit's users wrote before
    print(replica_id)
