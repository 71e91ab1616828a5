"""The soak's view of the toolkit's processes: which one plays which role (proxy,
controller, ingress replica, model replica), their RSS, open file descriptors and asyncio
tasks over time, and which node's proxy accepted a given client connection (nodes of a
local cluster share the port; the kernel picks the proxy)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import (
    NAMESPACE,
    PROXY_PREFIX,
    controller_actor,
    replica_actor,
)
from benchmarks.proc_cpu import _rss_mb, open_fds

#: Deployments whose replicas are ingresses (the others are "model replicas").
INGRESS_DEPLOYMENTS = frozenset({"SoakIngress", "OpenAiIngress"})


@dataclass(frozen=True, slots=True)
class ProcessSample:
    role: str  # proxy, controller, ingress replica, model replica
    name: str  # the node, the replica id, "controller"
    rss_mb: float
    fds: int
    tasks: int  # asyncio tasks (-1: the process does not say)


def role_of(deployment: str) -> str:
    return "ingress replica" if deployment in INGRESS_DEPLOYMENTS else "model replica"


def running_replicas() -> list[tuple[str, str, str, str]]:
    """(application, deployment, replica id, node) of every running replica, sorted."""
    found = []
    for app_name, app in tk.status().applications.items():
        for name, deployment in app.deployments.items():
            for replica in deployment.replicas:
                if replica.state is tk.ReplicaState.RUNNING:
                    found.append((app_name, name, replica.replica_id, replica.node_id))
    return sorted(found)


def _stats(actor: Any) -> dict[str, int]:
    return dict(ray.get(actor.stats.remote(), timeout=10))


def proxy_pids() -> dict[int, str]:
    """pid -> node of every live proxy."""
    found = {}
    for node in sorted(tk.status().proxies):
        try:
            found[_stats(ray.get_actor(PROXY_PREFIX + node, namespace=NAMESPACE))["pid"]] = node
        except Exception:  # noqa: BLE001 - one restarting right now
            continue
    return found


def sample() -> dict[int, ProcessSample]:
    """pid -> what it is and what it holds now (processes that do not answer are left out)."""
    found: dict[int, ProcessSample] = {}

    def add(role: str, name: str, actor: Any) -> None:
        try:
            stats = _stats(actor)
        except Exception:  # noqa: BLE001 - one being killed or replaced right now
            return
        pid = stats["pid"]
        found[pid] = ProcessSample(role, name, _rss_mb(pid), open_fds(pid), stats.get("tasks", -1))

    for node in sorted(tk.status().proxies):
        add("proxy", node, ray.get_actor(PROXY_PREFIX + node, namespace=NAMESPACE))
    add("controller", "controller", controller_actor())
    for _app, deployment, replica_id, _node in running_replicas():
        add(role_of(deployment), replica_id, replica_actor(replica_id))
    return found


def _socket_inode(server_port: int, client_port: int) -> str:
    """The inode of the server side of the loopback connection from ``client_port``."""
    wanted_local, wanted_remote = f":{server_port:04X}", f":{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(wanted_local) and fields[2].endswith(wanted_remote):
            return fields[9]
    return ""


class ProxyFinder:
    """Which node's proxy holds a client connection: the proxy keeps each connection it
    accepted (also one it handed to a replica), so the server side's socket is among its
    file descriptors."""

    def __init__(self, server_port: int) -> None:
        self.server_port = server_port
        self.pids: dict[int, str] = {}
        self.refreshed = 0.0

    def refresh(self) -> None:
        self.pids = proxy_pids()
        self.refreshed = time.monotonic()

    def node_of(self, client_port: int) -> str:
        """The node, or "" if no live proxy holds it (gone already, or not accepted yet)."""
        inode = _socket_inode(self.server_port, client_port)
        if not inode:
            return ""
        target = f"socket:[{inode}]"
        for pid, node in list(self.pids.items()):
            try:
                for fd in os.scandir(f"/proc/{pid}/fd"):
                    if os.readlink(fd.path) == target:
                        return node
            except OSError:
                continue  # the proxy died, or a descriptor closed as it was read
        return ""
