"""How many threads a replica's numerical libraries take: Ray's rule for the processes
of its replicas, which the local backend applies to its own process, where its replicas
run.

Ray sets ``OMP_NUM_THREADS`` in a replica's process, unless it is set already, to the
CPUs the replica reserves rounded down, at least 1 (``ray._private.utils.
set_omp_num_threads_if_unset``): OpenMP, MKL and torch then take that many threads
instead of one per core in every replica. The local backend's replicas share one
process, which has one such count: the largest of its running replicas' applies, a value
the process had before (the user's) wins as on Ray, and the process gets its own values
back when its last replica stops.
"""

from __future__ import annotations

import math
import os
import sys

__all__ = ["PROCESS_THREADS", "ProcessThreads", "omp_threads"]

_VARIABLE = "OMP_NUM_THREADS"


def omp_threads(num_cpus: float) -> int:
    """Ray's ``OMP_NUM_THREADS`` for a replica that reserves ``num_cpus`` CPUs."""
    return max(math.floor(num_cpus), 1)


class ProcessThreads:
    """Ray's thread rule for the replicas that run in this process: sets
    ``OMP_NUM_THREADS`` (read by torch when it is imported) and, torch already imported,
    ``torch.set_num_threads``."""

    def __init__(self) -> None:
        self._replicas: dict[str, int] = {}  # replica id -> its threads
        self._set: str | None = None  # the value this object put in the environment
        self._torch_before: int | None = None  # torch's own count, when it was loaded before

    def started(self, replica_id: str, num_cpus: float) -> None:
        """Replica ``replica_id``, which reserves ``num_cpus``, starts in this process
        (called before its constructor, which may import torch)."""
        self._replicas[replica_id] = omp_threads(num_cpus)
        self._apply()

    def stopped(self, replica_id: str) -> None:
        """Replica ``replica_id`` stopped (or failed to start)."""
        if self._replicas.pop(replica_id, None) is not None:
            self._apply()

    def forget_all(self) -> None:
        """The session ended: no replica runs here any more, whether or not each said so."""
        self._replicas.clear()
        self._apply()

    def _apply(self) -> None:
        current = os.environ.get(_VARIABLE)
        if current is not None and current != self._set:
            return  # the process's own value: Ray keeps it too
        torch = sys.modules.get("torch")
        if not self._replicas:  # the last one stopped: the process's own values back
            os.environ.pop(_VARIABLE, None)
            if torch is not None and self._torch_before is not None:
                torch.set_num_threads(self._torch_before)
            self._set = self._torch_before = None
            return
        threads = str(max(self._replicas.values()))
        if threads == self._set:
            return
        if self._set is None and torch is not None:
            self._torch_before = torch.get_num_threads()
        os.environ[_VARIABLE] = self._set = threads
        if torch is not None:  # loaded already: it no longer reads the variable
            torch.set_num_threads(int(threads))


#: The local backend's: one per process, as the environment is.
PROCESS_THREADS = ProcessThreads()
