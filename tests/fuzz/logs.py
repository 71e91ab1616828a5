"""What the toolkit's processes serving the fuzzer's cases wrote to their logs: a
traceback there is a failure, whatever the client saw (uvicorn's one-line warnings about
invalid requests are not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import NAMESPACE, PROXY_PREFIX, replica_actor


def _pids(apps: list[str]) -> list[int]:
    """The process ids of this node's proxy and of the replicas of ``apps``."""
    node = ray.get_runtime_context().get_node_id()
    proxy: Any = ray.get_actor(PROXY_PREFIX + node, namespace=NAMESPACE)  # ray types it Never
    pids = [ray.get(proxy.stats.remote())["pid"]]
    for app in apps:
        for deployment in tk.status().applications[app].deployments.values():
            for replica in deployment.replicas:
                actor: Any = replica_actor(replica.replica_id)
                pids.append(ray.get(actor.stats.remote())["pid"])
    return pids


class LogWatch:
    """The logs of the proxy and the replicas of ``apps``, from now on."""

    def __init__(self, apps: list[str]) -> None:
        logs = Path(ray._private.worker._global_node.get_logs_dir_path())  # type: ignore[attr-defined]
        self._files = [path for pid in _pids(apps) for path in logs.glob(f"worker-*-{pid}.*")]
        self._offsets = {path: path.stat().st_size for path in self._files}

    def tracebacks(self) -> list[str]:
        """Each traceback written since the last call, with the lines after it."""
        found = []
        for path in self._files:
            with path.open("rb") as log:
                log.seek(self._offsets[path])
                text = log.read().decode(errors="replace")
                self._offsets[path] = log.tell()
            lines = text.splitlines()
            found += ["\n".join(lines[i : i + 30]) for i, line in enumerate(lines) if "Traceback" in line]
        return found
