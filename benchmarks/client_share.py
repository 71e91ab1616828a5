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
import os
from collections.abc import Iterator
from pathlib import Path

#: The clients' nice value while they measure: about 10x the weight of a nice-0 group.
NICE = -10

_AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled")
_OURS = Path("/proc/self/autogroup")


@contextlib.contextmanager
def clients_first(nice: int = NICE) -> Iterator[str]:
    """Run the block with this process's scheduling weight raised to ``nice``: its
    session's autogroup where autogroups are on (every process of the session: the
    clients and this benchmark), else this thread's nice value. Yields a line saying
    which, or why nothing changed (lowering a nice value needs ``CAP_SYS_NICE``); the
    previous value is restored at the end."""
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
        yield f"{what} left at nice {previous}: {exc.strerror} (lowering it needs CAP_SYS_NICE)"
        return
    try:
        yield f"{what} at nice {nice} (was {previous})"
    finally:
        _set(grouped, previous)


def _set(grouped: bool, nice: int) -> None:
    if grouped:
        _OURS.write_text(str(nice))
    else:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
