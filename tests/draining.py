"""Draining one replica in tests, and reading a stream through a drain.

``drain_replica`` asks a replica to drain as its controller does when it stops it
(``ReplicaCore.drain``, through the Ray actor on Ray), but leaves the controller out: the
replica stays in the tables (it refuses what comes, so callers go elsewhere) until the
test's app is deleted. It is how a test drains the one replica its client reads from,
or drains in a hurry (``hurry=True``, which ``app-toolkit run --reload`` asks for).
"""

from __future__ import annotations

import threading
import time

import app_toolkit as tk
from app_toolkit._runtime.backends.base import current_session
from app_toolkit._runtime.backends.local import LocalLink
from tests.conftest import Toolkit


def replica_ids(app: str, deployment: str = "Ingress") -> list[str]:
    return [r.replica_id for r in tk.status().applications[app].deployments[deployment].replicas]


def drain_replica(toolkit: Toolkit, replica_id: str, hurry: bool = False) -> None:
    """Drain ``replica_id`` as its controller would; returns once it has drained."""
    if toolkit.backend == "local":
        session = current_session(create=False)
        assert session is not None and isinstance(session.link, LocalLink)
        core = session.link.backend.cores[replica_id]
        session.data_plane.run(core.drain(hurry))
        return
    import ray

    from app_toolkit._runtime.backends.ray.cluster import replica_actor

    ray.get(replica_actor(replica_id).drain.remote(hurry), timeout=60)


class StreamReader:
    """Reads an SSE stream in a thread: its lines, when each came (``time.monotonic()``),
    its response headers, and when it ended."""

    def __init__(self, toolkit: Toolkit, path: str, headers: dict[str, str] | None = None) -> None:
        self.lines: list[tuple[float, str]] = []
        self.headers: dict[str, str] = {}
        self.ended_at: float | None = None
        self.error: BaseException | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(toolkit, path, headers or {}), daemon=True)
        self._thread.start()

    def _read(self, toolkit: Toolkit, path: str, headers: dict[str, str]) -> None:
        try:
            with toolkit.client() as client, client.stream("GET", path, headers=headers) as response:
                self.headers = dict(response.headers)
                for line in response.iter_lines():
                    self.lines.append((time.monotonic(), line))
                    if line.startswith("data:"):
                        self._started.set()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self._started.set()

    def wait_started(self, timeout_s: float = 30) -> None:
        """Until the first event came."""
        assert self._started.wait(timeout_s), "the stream sent no event"
        assert self.error is None, self.error

    def join(self, timeout_s: float = 30) -> None:
        self._thread.join(timeout_s)
        assert self.ended_at is not None, "the stream did not end"
        assert self.error is None, self.error

    def text(self) -> list[str]:
        return [line for _, line in self.lines if line]

    def data_after(self, moment: float) -> int:
        """How many events came after ``moment``."""
        return sum(1 for at, line in self.lines if at > moment and line.startswith("data:"))
