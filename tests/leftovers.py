"""Processes a test session leaves behind: found by a mark in their environment.

Every process this pytest process starts (a scenario, a CLI, Redis, Ray's own GCS,
raylets and workers) inherits ``OWNER_VARIABLE`` set to a mark of this session's, even when it
moved to a session of its own or was re-parented to init after its parent was killed. At
the end of the session ``leftovers()`` lists those still running; the suite's conftest
stops them by PID and fails the run, naming them, so a test that times out cannot leave a
cluster running after the job that started it.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

#: The environment variable that marks a process as started by this test session.
OWNER_VARIABLE = "APP_TOOLKIT_TEST_OWNER"


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str


def mark_this_process() -> str:
    """Mark every process started from now on as this session's; returns the mark (new
    for each session: a process left by an earlier one is never taken for this one's)."""
    mark = uuid.uuid4().hex
    os.environ[OWNER_VARIABLE] = mark
    return mark


def mark_bytes(mark: str) -> bytes:
    """How ``mark`` reads in a process's /proc/PID/environ."""
    return f"{OWNER_VARIABLE}={mark}".encode()


def carries(entry: Path, wanted: bytes) -> bool:
    """Whether process ``entry`` (its /proc folder) started with the mark ``wanted``
    (``mark_bytes``). OSError when it is gone or not ours to read."""
    return wanted in (entry / "environ").read_bytes().split(b"\0")


def stat_fields(entry: Path) -> list[str]:
    """The fields of process ``entry``'s /proc/PID/stat after "pid (comm)" (comm may hold
    spaces and parentheses): its state first. OSError when it is gone."""
    return (entry / "stat").read_text().rpartition(")")[2].split()


def leftovers(mark: str) -> list[Leftover]:
    """Live processes other than this one whose environment carries ``mark``."""
    return leftovers_among(
        mark, [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    )


def leftovers_among(mark: str, pids: list[int]) -> list[Leftover]:
    """Those of ``pids`` that are live processes other than this one carrying ``mark``."""
    wanted = mark_bytes(mark)
    found = []
    for pid in pids:
        entry = Path("/proc") / str(pid)
        if pid == os.getpid():
            continue
        try:
            if not carries(entry, wanted) or stat_fields(entry)[0] == "Z":  # a zombie
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found.append(Leftover(pid, command.strip()[:200]))
    return found


def stop_leftovers(mark: str, grace_s: float) -> list[Leftover]:
    """Wait up to ``grace_s`` for this session's processes to end (Ray's shut down in the
    background), then kill what remains; returns what had to be killed."""
    deadline = time.monotonic() + grace_s
    while (remaining := leftovers(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for process in remaining:
        try:  # through a pidfd, the mark read again: a PID reused meanwhile is left alone
            descriptor = os.pidfd_open(process.pid)
        except ProcessLookupError:
            continue
        try:
            if process in leftovers_among(mark, [process.pid]):
                signal.pidfd_send_signal(descriptor, signal.SIGKILL)
        finally:
            os.close(descriptor)
    return remaining
