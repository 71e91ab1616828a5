"""The toolkit on a Ray cluster: its namespace and actor names, actor defaults, worker
set-up and joining (or starting) the cluster.

With the other modules of this package, the only ones that import ``ray``.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import ray
from packaging.requirements import Requirement  # Ray's own dependency
from packaging.specifiers import SpecifierSet
from ray.exceptions import RayActorError

from app_toolkit._runtime import console_pipe, log_format, tracing
from app_toolkit._runtime.backends.ray import bytecode, ray_compat
from app_toolkit.config import LOG_LEVEL_ENV
from app_toolkit.exceptions import ConfigError

logger = logging.getLogger("app_toolkit.ray")

NAMESPACE = "app_toolkit"
CONTROLLER_NAME = "app_toolkit_controller"
REPLICA_PREFIX = "app_toolkit_replica:"
PROXY_PREFIX = "app_toolkit_proxy:"
#: A spare replica process's actor (backends/ray/spares.py); it keeps the name when it
#: becomes a replica (ReplicaInfo.actor).
SPARE_PREFIX = "app_toolkit_spare:"
#: How many spare replica processes each node keeps (backends/ray/spares.py).
SPARES_ENV = "APP_TOOLKIT_SPARE_REPLICAS"
_HEAD_RESOURCE = "node:__internal_head__"  # Ray gives the head node this resource
#: Where this node's replicas listen for the data plane. The embedded cluster sets it to
#: loopback (its raylet, and so every worker, inherits it from the driver); elsewhere
#: replicas listen on their node's cluster address, which other nodes' callers dial.
DATA_PLANE_HOST_ENV = "APP_TOOLKIT_DATA_PLANE_HOST"
_WILDCARDS = ("", "0.0.0.0", "::", "*")


def data_plane_host() -> str:
    """The one address a replica on this node listens on (never all interfaces)."""
    host = os.environ.get(DATA_PLANE_HOST_ENV, "").strip()
    if not host:
        return node_address()
    if host in _WILDCARDS:
        raise ConfigError(
            f"{DATA_PLANE_HOST_ENV}={host!r} would listen on every interface; set it to one "
            "address of this node that the cluster's other nodes can reach, or unset it."
        )
    return host


def node_address() -> str:
    """The address this Ray node was started with (127.0.0.1 on the embedded cluster).

    Not ``ray.util.get_node_ip_address()``: that returns the machine's routable address
    even when the node itself listens on loopback only.
    """
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node["NodeID"] == node_id:
            return str(node["NodeManagerAddress"])
    raise RuntimeError(f"This Ray node ({node_id}) is not in the cluster's node table")


def head_node_id() -> str:
    """The cluster's head node: where the controller (and a HeadOnly proxy) run."""
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node["Alive"] and _HEAD_RESOURCE in node["Resources"]:
            return str(node["NodeID"])
    raise ConfigError("This Ray cluster has no live head node; start one with `ray start --head`.")


def configure_worker() -> None:
    """Logs at the level and in the format the driver asked (``log_format``), and the
    OpenTelemetry set-up it named, from the environment."""
    log_format.configure()
    try:
        tracing.setup_from_env()
    except Exception:
        logger.exception("The OpenTelemetry set-up (%s) failed in this process: no spans", tracing.SETUP_ENV)


def settle_heap() -> None:
    """Once a serving process has started: collect what starting left behind, then move
    every object alive now (modules, the app, the server) out of the collector's reach.
    They live as long as the process, and a full collection would otherwise walk all of
    them, stalling the requests of that moment."""
    gc.collect()
    gc.freeze()


# ------------------------------------------------------------------------------- actors

#: Every toolkit actor: no CPU reserved (control and I/O), many concurrent calls.
_ACTOR_DEFAULTS: dict[str, object] = {"num_cpus": 0, "max_concurrency": 10_000}


def remote(cls: type, **options: object) -> Any:
    """``cls`` as a Ray actor class with the toolkit's defaults and ``options``."""
    return ray.remote(cls).options(**{**_ACTOR_DEFAULTS, **options})


#: glibc's allocator settings for the processes of an embedded cluster (they inherit this
#: process's environment; yours win). With its defaults, a worker thread that frees a
#: request body of a MiB or more hands the pages back to the kernel, and the next body
#: faults them in again: 256 page faults per MiB, per copy. Bodies below 32 MiB now come
#: from the heap, and up to 64 MiB of freed memory stays for the next one. POST 1 MiB:
#: replica CPU per request 1.23 -> 0.47 ms, proxy 1.27 -> 0.68 ms
#: (docs/benchmarks-history.md, 2026-11-23 morning).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}


def init_ray(address: str | None, **options: Any) -> None:
    """Join ``address`` (or RAY_ADDRESS), or start an embedded single-node cluster
    (``options`` go to ``ray.init``)."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    for name, value in ray_compat.ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        bytecode.warn_if_compiled_at_each_start()  # the embedded cluster runs from this install
        # Ray runs workers at nice 15 by default; on a small machine serving replicas then
        # lose the CPU to everything else. The embedded cluster runs them at normal priority.
        os.environ.setdefault("RAY_worker_niceness", "0")
        for name, value in MALLOC_ENV.items():
            os.environ.setdefault(name, value)
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "configure_logging": False,
        **options,
    }
    # A cluster started elsewhere did not inherit this process's environment: the log
    # level and format reach this job's workers through its runtime environment.
    forwarded = (LOG_LEVEL_ENV, log_format.FORMAT_ENV, tracing.SETUP_ENV, SPARES_ENV, *MALLOC_ENV)
    asked = {name: os.environ[name] for name in forwarded if name in os.environ}
    if address is not None and asked and "runtime_env" not in kwargs:
        kwargs["runtime_env"] = {"env_vars": asked}
    if address is None:
        # "local": always a new embedded cluster. Without an address Ray joins the cluster
        # `ray start` last started on this machine, even one that has died since.
        address = "local"
    if threading.current_thread() is threading.main_thread():
        _start_or_join(address, kwargs)
    else:
        _on_lasting_thread(lambda: _start_or_join(address, kwargs))


def _join(address: str, kwargs: dict[str, Any]) -> None:
    """Join the cluster at ``address``; a cluster of another Ray or Python is refused with
    what differs and what to do (Ray's own refusal is a traceback to most readers)."""
    try:
        ray.init(address=address, **kwargs)
    except RuntimeError as exc:
        skew = ray_compat.version_skew(exc)
        if skew is None:
            raise
        raise ConfigError(
            f"The Ray cluster at {address!r} runs Ray {skew.cluster_ray} on Python "
            f"{skew.cluster_python}; this process has Ray {skew.driver_ray} on Python "
            f"{skew.driver_python}. A program joins a Ray cluster only with the same Ray and "
            f"Python versions. {_skew_fix(skew)}"
        ) from None


def _skew_fix(skew: ray_compat.VersionSkew) -> str:
    """What to do about ``skew``: this environment to the cluster's versions where this
    app_toolkit supports the cluster's Ray, else the cluster to a Ray it supports."""
    fixes = []
    if skew.cluster_ray != skew.driver_ray:
        supported = _supported_ray()
        if supported is None or SpecifierSet(supported).contains(skew.cluster_ray):
            fixes.append(
                f"Install the cluster's Ray here (pip install 'ray=={skew.cluster_ray}'), or start "
                "the cluster from this environment (ray start --head)."
            )
        else:
            fixes.append(
                f"This app_toolkit supports Ray {supported}, which {skew.cluster_ray} is not: run "
                f"the cluster on a Ray in that range ({skew.driver_ray}, as here, is one)."
            )
    if skew.cluster_python != skew.driver_python:
        fixes.append(f"Run this program on Python {skew.cluster_python}, the cluster's.")
    return " ".join(fixes)


def _supported_ray() -> str | None:
    """The Ray range this app_toolkit declares (its installed metadata), if it can be read."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        declared = requires("app_toolkit") or []
    except PackageNotFoundError:
        return None
    found = next((req for req in map(Requirement, declared) if req.name == "ray"), None)
    if found is None or found.marker is not None:
        return None
    return ",".join(sorted(map(str, found.specifier), key=lambda bound: not bound.startswith(">")))


def _start_or_join(address: str, kwargs: dict[str, Any]) -> None:
    if address != "local":
        _join(address, kwargs)
        return
    # Ray advertises the machine's routable address even for a cluster of one; the
    # toolkit's sockets stay on loopback (docs/security.md). Access lines take the short
    # way to this process's console (console_pipe). The raylet, and so every worker,
    # inherits these settings; this process (and what it starts later) does not.
    given = {DATA_PLANE_HOST_ENV: "127.0.0.1"}
    pipe = console_pipe.for_workers()
    if pipe is not None:
        given[console_pipe.PIPE_ENV] = pipe
    before: dict[str, str | None] = {name: os.environ.get(name) for name in given}
    for name, value in given.items():
        os.environ.setdefault(name, value)
    try:
        ray.init(address=address, **kwargs)
    finally:
        for name, was in before.items():
            if was is None:
                os.environ.pop(name, None)
    global _console_closes_at_exit
    if pipe is not None and not _console_closes_at_exit:
        # Registered after Ray's own exit handler, so it runs first: Ray stops (with the
        # pause its own exit gives workers' last lines), then the pipe closes.
        _console_closes_at_exit = True
        atexit.register(_stop_then_close_console)


_console_closes_at_exit = False


def _stop_then_close_console() -> None:
    with contextlib.suppress(Exception):  # at exit: nothing left to tell about a failed stop
        ray.shutdown(_exiting_interpreter=True)
    console_pipe.close()


# Ray starts an embedded cluster's processes (GCS, raylet) with PR_SET_PDEATHSIG, and
# Linux sends that signal when the *thread* that started them exits, not the process. Ray
# started from a short-lived thread (a web framework's worker, a thread pool) would lose its
# cluster when that thread ends, hang the next call and abort the process a minute later.
# So from any thread but the main one, Ray is started from this thread, which lives (idle)
# as long as the process does.
_lasting_jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[None]]] = queue.SimpleQueue()
_lasting_thread: threading.Thread | None = None
_lasting_lock = threading.Lock()


def _on_lasting_thread(job: Callable[[], object]) -> None:
    """Run ``job`` on the process-long thread and return (or raise) what it did."""
    global _lasting_thread
    with _lasting_lock:
        if _lasting_thread is None:
            _lasting_thread = threading.Thread(target=_run_lasting_jobs, name="app-toolkit-ray", daemon=True)
            _lasting_thread.start()
    done: Future[None] = Future()
    _lasting_jobs.put((job, done))
    done.result()  # ray.init has its own timeouts; it raises rather than hangs


def _run_lasting_jobs() -> None:
    while True:  # never returns: the thread must outlive the processes it started
        job, done = _lasting_jobs.get()
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            done.set_exception(exc)
        else:
            done.set_result(None)


def controller_actor() -> Any:
    """The running controller actor (ValueError if there is none)."""
    return ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)


def replica_actor(replica_id: str) -> Any:
    """The actor of a running replica (for tools and tests): named after the replica, or
    a spare process it was started in (ValueError if there is none)."""
    try:
        return ray.get_actor(REPLICA_PREFIX + replica_id, namespace=NAMESPACE)
    except ValueError:
        pass
    for name in named_actors():
        if name.startswith(SPARE_PREFIX):
            try:
                actor = ray.get_actor(name, namespace=NAMESPACE)
                becomes: object = ray.get(actor.replica_id.remote(), timeout=30)
            except (ValueError, RayActorError):
                continue  # a spare that died
            if becomes == replica_id:
                return actor
    raise ValueError(f"No running replica {replica_id!r}")


def named_actors() -> list[str]:
    return [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == NAMESPACE
    ]
