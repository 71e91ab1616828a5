"""A deployment that says which replica ran the call (session affinity tests)."""

from __future__ import annotations

import app_toolkit as tk


@tk.deployment(num_replicas=4)
class Who:
    def __call__(self) -> str:
        return tk.get_replica_context().replica_id
