"""The CPU a test costs the machine: this test process's and every process it started
(Ray's GCS, raylets and workers, a CLI's cluster, a scenario's nodes), recorded in the
JUnit XML beside the test's time (``.ci/time_table.py`` reads it).

The suite runs on 2 cores in 3 workers: a test's wall time grows with what the other
workers do, its CPU does not, so CPU is what tells the costly tests from the slow ones.

A process's CPU cannot be read once it has ended, and its parent's children's time does
not always get it (Ray's raylet reaps its workers without counting them), so a thread
reads every process carrying this session's mark twice a second and keeps the last
figure of those that ended. What a process spends in its last half second (and one that
lives less) is missed. The figures include what the sampling costs (a few ms each half
second) and the worker's own idle Ray cluster while the test runs, which grows with the
test's wall time: the first Ray test of a worker also carries its cluster's start.
"""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

from tests.leftovers import carries, mark_bytes, stat_fields

_TICKS = os.sysconf("SC_CLK_TCK")
_PERIOD_S = 0.5
_YOUNG_S = 2.0


class CpuMeter:
    """CPU seconds of this process and of every process carrying ``mark``, ended or not."""

    def __init__(self, mark: str) -> None:
        self._wanted = mark_bytes(mark)
        self._lock = threading.Lock()
        #: pid and start time (a reused pid is another process) -> whether it is ours.
        self._ours: dict[tuple[str, str], bool] = {}
        self._live: dict[tuple[str, str], float] = {}
        self._ended = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)
        self._thread.start()

    def seconds(self) -> float:
        self._sample()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with self._lock:
            return usage.ru_utime + usage.ru_stime + self._ended + sum(self._live.values())

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(_PERIOD_S):
            self._sample()

    def _sample(self) -> None:
        with self._lock:  # the thread and seconds() both sample
            present: dict[tuple[str, str], bool] = {}
            live: dict[tuple[str, str], float] = {}
            me = str(os.getpid())
            uptime = float(Path("/proc/uptime").read_text().split()[0])
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or entry.name == me:
                    continue
                try:
                    fields = stat_fields(entry)
                    key = (entry.name, fields[19])  # field 22 of stat: the start time
                    cpu = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
                    ours = self._ours.get(key)
                    if ours is None:
                        ours = carries(entry, self._wanted)
                except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
                    # Still listed: its last figure stays live (not counted as ended, then
                    # again when read next).
                    live.update((key, cpu) for key, cpu in self._live.items() if key[0] == entry.name)
                    continue
                # A process seen between fork and exec still shows its parent's first
                # environment: a young one is asked again next time.
                if ours or uptime - int(fields[19]) / _TICKS > _YOUNG_S:
                    present[key] = ours
                if ours:
                    live[key] = cpu
            self._ended += sum(cpu for key, cpu in self._live.items() if key not in live)
            self._live = live
            self._ours = present
