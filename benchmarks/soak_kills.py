"""The soak's kills, one function per kind (soak_schedule.KINDS), each returning the
:class:`~benchmarks.soak_rules.Kill` it made; and the reply store's Redis, which one of
them kills and starts again. Every process killed here is one this run started (its
cluster's actors, its worker nodes, its Redis), found by its pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import NAMESPACE, PROXY_PREFIX, controller_actor, replica_actor
from benchmarks.soak_apps import SMOL_DEPLOYMENT
from benchmarks.soak_processes import INGRESS_DEPLOYMENTS, running_replicas
from benchmarks.soak_rules import Kill
from benchmarks.soak_schedule import PlannedKill

WORKER_CPUS = 2
#: The longest a killed part may take to serve again; longer is reported (a bug, or a
#: machine too busy), and the soak goes on.
RECOVERY_LIMIT_S = 150.0  # above a SmolLM2 replica's replacement (41-52 s under load)


def _wait(condition: Callable[[], bool]) -> float:
    """When ``condition`` first held (polled; errors count as not yet), or 0.0 if it did
    not within RECOVERY_LIMIT_S."""
    deadline = time.monotonic() + RECOVERY_LIMIT_S
    while time.monotonic() < deadline:
        try:
            if condition():
                return time.monotonic()
        except Exception:  # noqa: BLE001 - the part (or the controller) is still coming back
            pass
        time.sleep(0.1)
    return 0.0


def _all_running() -> bool:
    """Every deployment has its target of running replicas."""
    return all(
        sum(r.state is tk.ReplicaState.RUNNING for r in deployment.replicas) >= deployment.target_replicas
        for app in tk.status().applications.values()
        for deployment in app.deployments.values()
    )


def _pid(actor: Any) -> int:
    return int(ray.get(actor.stats.remote(), timeout=5)["pid"])


class RedisServer:
    """A redis-server on 127.0.0.1 as the tests start one (tests/redis_server.py: no
    persistence, loopback only), which can be SIGKILLed and started again on its port."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.workdir = tempfile.TemporaryDirectory(prefix="app-toolkit-soak-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = Path(self.workdir.name) / "redis.log"
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        args += ["--dir", self.workdir.name, "--logfile", str(log)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                said = log.read_text()[-500:] if log.exists() else ""
                raise RuntimeError(f"redis-server did not start on port {self.port}: {said}")
            time.sleep(0.02)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as probe:
                probe.sendall(b"PING\r\n")
                return probe.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.workdir.cleanup()


def _pick(candidates: list[Any], pick: float) -> Any:
    if not candidates:
        raise LookupError("nothing of that kind is running")
    return candidates[min(len(candidates) - 1, int(pick * len(candidates)))]


def _sigkill(actor: Any) -> int:
    pid = int(ray.get(actor.stats.remote(), timeout=30)["pid"])
    os.kill(pid, signal.SIGKILL)
    return pid


@dataclass
class Killer:
    cluster: Any  # ray.cluster_utils.Cluster (unannotated)
    redis: RedisServer
    head: str
    workers: list[Any] = field(default_factory=list)  # the cluster's worker nodes

    def add_worker(self) -> None:
        node = self.cluster.add_node(num_cpus=WORKER_CPUS, node_ip_address="127.0.0.1")
        self.workers.append(node)

    def kill(self, planned: PlannedKill) -> tuple[Kill, str]:
        """Make the planned kill now and wait until what it killed serves again (run it
        on the main thread: Ray's test cluster adds and removes nodes only there);
        returns the kill and a line saying what died and when it was back."""
        kill, said = getattr(self, "_" + planned.kind)(planned.pick)
        if not kill.recovered:
            return kill, f"{said}, NOT BACK after {RECOVERY_LIMIT_S:.0f} s"
        return kill, f"{said}, back in {kill.recovered - kill.started:.1f} s"

    def _replica(self, kind: str, pick: float) -> tuple[Kill, str]:
        ingress = kind == "ingress"
        replicas = [r for r in running_replicas() if (r[1] in INGRESS_DEPLOYMENTS) == ingress]
        smol = [r for r in replicas if r[1] == SMOL_DEPLOYMENT]
        if not ingress and smol:  # half the model kills take a SmolLM2 replica: its replies are long
            others = [r for r in replicas if r[1] != SMOL_DEPLOYMENT] or smol
            replicas, pick = (smol, pick * 2) if pick < 0.5 else (others, (pick - 0.5) * 2)
        app, deployment, replica_id, node = _pick(replicas, pick)
        started = time.monotonic()
        pid = _sigkill(replica_actor(replica_id))
        kill = Kill(kind, started, time.monotonic(), replica_id, node, app, deployment)

        def replaced() -> bool:
            status = tk.status().applications[app].deployments[deployment]
            running = [r.replica_id for r in status.replicas if r.state is tk.ReplicaState.RUNNING]
            return replica_id not in running and len(running) >= status.target_replicas

        kill = replace(kill, recovered=_wait(replaced))
        return kill, f"{kind} replica {replica_id} of {app}/{deployment} on {node[:8]} (pid {pid})"

    def _ingress(self, pick: float) -> tuple[Kill, str]:
        return self._replica("ingress", pick)

    def _model(self, pick: float) -> tuple[Kill, str]:
        return self._replica("model", pick)

    def _proxy(self, pick: float) -> tuple[Kill, str]:
        node = _pick(sorted(tk.status().proxies), pick)
        started = time.monotonic()
        actor = ray.get_actor(PROXY_PREFIX + node, namespace=NAMESPACE)
        pid = _sigkill(actor)
        kill = Kill("proxy", started, time.monotonic(), node, node)
        kill = replace(kill, recovered=_wait(lambda: _pid(actor) != pid))
        return kill, f"proxy of {node[:8]} (pid {pid})"

    def _controller(self, pick: float) -> tuple[Kill, str]:
        started = time.monotonic()
        pid = _sigkill(controller_actor())
        kill = Kill("controller", started, time.monotonic(), "controller", self.head)
        kill = replace(kill, recovered=_wait(lambda: _pid(controller_actor()) != pid and bool(tk.status())))
        return kill, f"controller (pid {pid})"

    def _node(self, pick: float) -> tuple[Kill, str]:
        """A worker node's raylet and everything on it; a fresh node joins after."""
        worker = _pick(self.workers, pick)
        started = time.monotonic()
        self.cluster.remove_node(worker)
        ended = time.monotonic()
        self.workers.remove(worker)
        self.add_worker()
        joined = self.workers[-1].node_id
        kill = Kill("node", started, ended, worker.node_id, worker.node_id)
        kill = replace(kill, recovered=_wait(lambda: joined in tk.status().proxies and _all_running()))
        return (
            kill,
            f"worker node {worker.node_id[:8]} (removed in {ended - started:.1f} s; a new one joined)",
        )

    def _redis(self, pick: float) -> tuple[Kill, str]:
        started = time.monotonic()
        pid = self.redis.process.pid if self.redis.process else 0
        self.redis.kill()
        self.redis.start()  # empty: no persistence, as the tests run it
        ended = time.monotonic()
        kill = Kill("redis", started, ended, "redis", recovered=ended)
        return kill, f"redis-server (pid {pid}), started again"
