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


def process_label(pid: int) -> str:
    """A short name for a process of a server's tree: Ray's actor name (``ReplicaActor``),
    a Ray script (``log_monitor``, ``dashboard_agent``), a binary (``gcs_server``,
    ``raylet``), or the program (``python``: a driver, a plain worker)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        argv = [part.decode(errors="replace") for part in raw.split(b"\0")]
    except OSError:
        return ""
    first = argv[0] if argv else ""
    if first.startswith("ray::"):
        return first.removeprefix("ray::").split(".")[0].split(" ")[0] or "ray worker"
    for part in argv[1:3]:  # python SCRIPT ...: name the script
        if part.endswith(".py"):
            return Path(part).stem
    return Path(first.split(" ")[0]).name or "?"


def cpu_by_process(root: int) -> dict[int, tuple[str, float]]:
    """User + system CPU seconds of each live process in ``root``'s tree, with its label
    (:func:`process_label`). Subtract two readings to see where a run's CPU went."""
    found = {}
    for pid in tree(root):
        fields = _stat(pid)
        if fields is not None:
            found[pid] = (process_label(pid), (int(fields[11]) + int(fields[12])) / TICKS)
    return found


def cpu_spent(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per label between two :func:`cpu_by_process` readings (processes that
    share a label are added up; ones that ended in between are not counted)."""
    spent: dict[str, float] = {}
    for pid, (label, seconds) in after.items():
        spent[label] = spent.get(label, 0.0) + seconds - before.get(pid, (label, 0.0))[1]
    return spent


def started_at(pid: int) -> float:
    """The Unix time a process started (/proc: clock ticks since boot, against uptime)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    import time

    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def kb_field(pid: int, field: str, source: str = "status") -> int:
    """A "Name: N kB" field of /proc/PID/``source`` (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/{source}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rss_mb(pid: int) -> float:
    return kb_field(pid, "VmRSS") / 1024


def pss_mb(pid: int) -> float:
    """Proportional memory: pages shared with other processes count by their share."""
    return kb_field(pid, "Pss", "smaps_rollup") / 1024


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def toolkit_processes(root: int) -> dict[int, str]:
    """The toolkit's actor processes under ``root``: pid -> Ray's name for them
    (``ray::ProxyActor``, ``ray::ReplicaActor``, ``ray::ControllerActor``)."""
    found = {}
    for pid in tree(root):
        name = _name(pid)
        if name.startswith("ray::") and "Actor" in name:
            found[pid] = name.removeprefix("ray::").split(".")[0]  # Ray appends the running method
    return found


def rss_mb(pids: dict[int, str]) -> dict[str, float]:
    """Resident memory per process name (summed when several share it), in MB."""
    total: dict[str, float] = {}
    for pid, name in pids.items():
        total[name] = total.get(name, 0.0) + _rss_mb(pid)
    return total


def open_fds(pid: int) -> int:
    try:
        return len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        return 0
