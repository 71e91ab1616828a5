"""The embedding example with the real all-MiniLM-L6-v2 model (the `embeddings` extra).

No skip when the model is missing: `make test` installs it, and CI must run these.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np

from app_toolkit import get_deployment_handle, metrics
from app_toolkit.testing import TestClient
from examples.embeddings import app as embeddings
from tests.conftest import Toolkit

PARAPHRASES = ("A cat sits on the mat.", "A kitten is sitting on a rug.")
UNRELATED = "The central bank raised interest rates again."


def cosine(a: list[float], b: list[float]) -> float:
    va, vb = np.asarray(a), np.asarray(b)
    return float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb)))


def test_real_embeddings_and_batching_on_the_local_backend(no_backend: None) -> None:
    with TestClient(embeddings.app) as client:
        first, second, other = (
            client.post("/embed", json={"text": t}).json() for t in (*PARAPHRASES, UNRELATED)
        )
        assert first["dimension"] == len(first["vector"]) == 384
        assert cosine(first["vector"], second["vector"]) > cosine(first["vector"], other["vector"]) + 0.3
        assert client.post("/embed", json={"text": ""}).status_code == 422

        # remote() sends at once, so 48 calls from sync code are concurrent: batched.
        model = get_deployment_handle("Embedder", "embeddings")
        responses = [model.embed.remote(f"sentence number {i} about batching") for i in range(48)]
        assert [len(r.result(timeout_s=60)) for r in responses] == [384] * 48
    sizes = metrics.value("app_toolkit_batch_size", function="Embedder.embed")
    assert isinstance(sizes, metrics.HistogramValue) and sizes.mean > 1
    at_most_4 = dict(sizes.buckets)[4]  # cumulative: batches of 4 items or fewer
    assert at_most_4 < sizes.count  # so at least one batch held more than 4


def test_embedding_service_over_http_on_ray(ray_toolkit: Toolkit) -> None:
    ray_toolkit.run(embeddings.app, route_prefix="/emb")

    async def burst() -> list[httpx.Response]:
        async with ray_toolkit.async_client() as client:
            return list(
                await asyncio.gather(
                    *(client.post("/emb/embed", json={"text": f"text {i}"}) for i in range(32))
                )
            )

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 32
    assert {r.json()["dimension"] for r in responses} == {384}
