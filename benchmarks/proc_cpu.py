"""CPU seconds used by a process and all its descendants, read from /proc (Linux).

Steadier than requests per second on a shared machine: what a server spends per request
does not depend on how much CPU other work left it.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None  # gone
    return text[text.rindex(")") + 2 :].split()  # the name may hold spaces; fields follow ")"


def tree(root: int) -> set[int]:
    """``root`` and every process below it, now."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
    found, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
        found.update(children)
        frontier.extend(children)
    return found


def cpu_seconds(root: int) -> float:
    """User + system CPU of ``root``'s tree, counting each process's own time (children
    that ended are not counted: take both readings while the server runs)."""
    total = 0
    for pid in tree(root):
        fields = _stat(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS
