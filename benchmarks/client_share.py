"""The load generator's share of the CPU when it runs on the host it measures.

On a 2-core host the clients compete with the servers for the cores. Linux with session
autogroups (``/proc/sys/kernel/sched_autogroup_enabled``) weighs each session as one: a
server started in a session of its own (``start_new_session``) is one group, the
benchmark's session another. In the vLLM benchmark the clients' thread then waited in
the run queue for up to 2.8 s at a time while the replies were sent on time
(docs/benchmarks.md, "Where the 1-client first-token tail came from"): what it measured
was its own wait. :func:`clients_first` raises the clients' weight for the length of a
benchmark, the same for every server measured, and says what it did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

#: The clients' nice value while they measure: about 10x the weight of a nice-0 group.
NICE = -10

_AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled")
_OURS = Path("/proc/self/autogroup")


@dataclasses.dataclass(frozen=True)
class Share:
    """What :func:`clients_first` did: ``said``, a line for the report, and
    ``server_prefix``, what to put before the command of each server the benchmark starts
    (``nice -n K``, back to the value before, where the fallback raised this thread's
    weight, which a child inherits; nothing with autogroups: a server started in a
    session of its own is a group of its own, at nice 0)."""

    said: str
    server_prefix: tuple[str, ...] = ()


@contextlib.contextmanager
def clients_first(nice: int = NICE) -> Iterator[Share]:
    """Run the block with this process's scheduling weight raised to ``nice``: its
    session's autogroup where autogroups are on (every process of the session: the
    clients and this benchmark, and the shell that started it), else this thread's nice
    value. Yields a :class:`Share` saying which, or why nothing changed (lowering a nice
    value needs ``CAP_SYS_NICE``); the previous value is restored at the end (a SIGTERM included, as
    :func:`ended_by_sigterm` makes it; after a SIGKILL, ``echo 0 > /proc/self/autogroup``
    in that shell restores it)."""
    grouped = _AUTOGROUPS.is_file() and _AUTOGROUPS.read_text().strip() == "1" and _OURS.is_file()
    if grouped:
        previous = int(_OURS.read_text().split()[-1])  # "/autogroup-881 nice 0"
        what = "the clients' session autogroup"
    else:
        previous = os.getpriority(os.PRIO_PROCESS, 0)
        what = "the clients' thread"
    try:
        _set(grouped, nice)
    except OSError as exc:  # EPERM: lowering a nice value needs CAP_SYS_NICE
        needs = " (lowering it needs CAP_SYS_NICE)" if exc.errno == errno.EPERM else ""
        yield Share(f"{what} left at nice {previous}: {exc.strerror}{needs}")
        return
    prefix = () if grouped else ("nice", "-n", str(previous - nice))
    try:
        yield Share(f"{what} at nice {nice} (was {previous})", prefix)
    finally:
        try:
            _set(grouped, previous)
        except OSError as exc:  # EAGAIN: an autogroup's nice changes at most every 100 ms unprivileged
            print(f"{what} stays at nice {nice}: {exc.strerror}; set it back to {previous} yourself")


def ended_by_sigterm() -> None:
    """A SIGTERM ends this process as an exception would (SystemExit, status 143): the
    ``finally`` blocks run, so the servers started stop and the weight goes back."""
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))


def _set(grouped: bool, nice: int) -> None:
    if grouped:
        _OURS.write_text(str(nice))
    else:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
