"""What the toolkit's processes serving the fuzzer's cases wrote to their logs: a
traceback there is a failure, whatever the client saw (uvicorn's one-line warnings about
invalid requests are not)."""

from __future__ import annotations

import time
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
        pids = _pids(apps)
        self._files = [path for pid in pids for path in logs.glob(f"worker-*-{pid}.*")]
        found = {int(path.stem.rsplit("-", 1)[1]) for path in self._files}
        assert found == set(pids), f"no log files in {logs} for processes {set(pids) - found}"
        self._offsets = {path: path.stat().st_size for path in self._files}

    def settled(self, quiet_s: float = 0.3, limit_s: float = 5.0) -> list[str]:
        """:meth:`tracebacks`, once the logs have not grown for ``quiet_s`` (a traceback
        may be written just after the response that went with it)."""
        deadline, quiet_since, sizes = time.monotonic() + limit_s, time.monotonic(), self._sizes()
        while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_s:
            time.sleep(0.05)
            if (now := self._sizes()) != sizes:
                sizes, quiet_since = now, time.monotonic()
        return self.tracebacks()

    def _sizes(self) -> list[int]:
        return [path.stat().st_size for path in self._files]

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
