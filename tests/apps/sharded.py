"""A deployment that says which replica ran the call (session affinity tests)."""

from __future__ import annotations

import app_toolkit as tk
from tests.deployments import as_deployment


@tk.deployment(num_replicas=4)
class Who:
    def __call__(self) -> str:
        return tk.get_replica_context().replica_id

    async def named(self, prefix: str, *, victim: str = "") -> str:
        """``prefix`` and this replica's id; raises on replica ``victim`` (broadcast tests)."""
        replica_id = tk.get_replica_context().replica_id
        if replica_id == victim:
            raise ValueError(f"{replica_id} fails on purpose")
        return f"{prefix}{replica_id}"


@tk.deployment
class Model:
    def __call__(self) -> str:
        return "v1"


@tk.deployment
class ModelV2:
    def __call__(self) -> str:
        return "v2"


@tk.deployment
class Front:
    """Calls Model; holds ModelV2 too, so the application has both to split between."""

    def __init__(self, model: tk.DeploymentHandle, spare: tk.DeploymentHandle) -> None:
        self.model = model

    async def __call__(self) -> str:
        answer: str = await self.model.remote()
        return answer


front = as_deployment(Front).bind(as_deployment(Model).bind(), as_deployment(ModelV2).bind())
