"""Nodes of a two-node Ray cluster on this machine come and go under load: the second
node is lost (its processes killed), another joins, and that one leaves the way a
Kubernetes pod whose command is ``ray start --block`` does (SIGTERM to that process: Ray
drains the node, the toolkit moves its work off before it goes). Also:
``max_replicas_per_node`` over the two nodes, and a model of ``tensor_parallel_size: 2``
with an ``accelerator_type`` reserving its bundles on a node that joins with two GPUs and
that accelerator's resource declared (Ray's resources are counts: it stands in for a GPU
node).

Run in its own process by ``test_multinode.py`` (the test session's Ray is a different,
single-node cluster): ``python -m tests.integration.multinode_scenario``. It prints one
JSON line of observations for the test to check. Every wait is bounded.
"""

from __future__ import annotations

import os

# Every node and the driver on 127.0.0.1 (Ray otherwise advertises the machine's address).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# As the toolkit's own ray.init has it (ray_compat.ENVIRONMENT): Ray 2.52 warns otherwise.
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import ray
from ray.cluster_utils import Cluster

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import NAMESPACE, PROXY_PREFIX
from app_toolkit.config.api_keys import key_hash, new_key
from tests import plain_http
from tests.apps.ray_only import make_where_app
from tests.waiting import wait_for

LOADERS = 4
RECOVERY_LIMIT_S = 60.0
AFTER_RECOVERY_S = 2.0
#: How long the load goes on after a joining node's proxy is listed as serving.
AFTER_JOIN_S = 3.0
#: How long Ray's drain of a node whose ``ray start --block`` got SIGTERM may last (Ray's
#: RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S; its default, 30 s, here too).
RAY_DRAIN_S = 30.0
#: The graceful_shutdown_timeout_s of the replicas on the node that leaves.
GRACE_S = 2.0
#: API keys: one without limits for the load, one limited to LIMIT requests per window.
OPEN_KEY, LIMITED_KEY = new_key(), new_key()
OPEN = {"authorization": f"Bearer {OPEN_KEY}"}
LIMIT, LIMIT_WINDOW_S = 20, 10.0
KEYS = [
    {"name": "load", "hash": key_hash(OPEN_KEY)},
    {
        "name": "limited",
        "hash": key_hash(LIMITED_KEY),
        "requests_per_window": LIMIT,
        "window_s": LIMIT_WINDOW_S,
    },
]


@dataclass
class Outcome:
    at: float  # when the request started: monotonic, then seconds since the node was removed
    ended: float  # when its answer (or failure) came, likewise
    status: int  # 0: the connection failed
    retry_after: str | None
    node: str
    error: str
    #: The GET was sent again once: its first connection ended with no answer at once
    #: (a client may retry a GET so, RFC 9110 9.2.2).
    retried: bool = False


#: A connection that ends with no answer within this of its start never reached a server:
#: reset in the accept queue of a listener that closed (below).
_UNANSWERED_S = 0.05


def _load(url: str, stop: threading.Event, outcomes: list[Outcome], retry: bool = False) -> None:
    """Requests on fresh connections, so the kernel spreads them over both proxies.
    ``retry``: a GET whose connection ends at once with no answer is sent again, once. Two
    proxies on one host share their port (``SO_REUSEPORT``), and closing one's listener
    resets the connections still in its accept queue unless the host migrates them
    (``net.ipv4.tcp_migrate_req``, off by default); proxies on their own hosts have no
    such queue to lose, and a load balancer stops sending before they close."""
    while not stop.is_set():
        started = time.monotonic()
        retried = False
        while True:
            try:
                response = plain_http.get(url, timeout=10, headers=OPEN)
                status, node = (
                    response.status_code,
                    response.json().get("node", "") if response.status_code == 200 else "",
                )
                retry_after, error = response.headers.get("retry-after"), ""
            except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
                if retry and not retried and time.monotonic() - started < _UNANSWERED_S:
                    retried = True
                    continue
                status, node, retry_after, error = 0, "", None, type(exc).__name__
            except httpx.HTTPError as exc:
                status, node, retry_after, error = 0, "", None, type(exc).__name__
            break
        outcomes.append(Outcome(started, time.monotonic(), status, retry_after, node, error, retried))


def _routeless(session: Any) -> list[str]:
    """The nodes whose proxy listened before it had its routes (they came too late)."""
    proxies: dict[str, Any] = {  # Any: ray types actor methods as Never
        node: ray.get_actor(PROXY_PREFIX + node, namespace=NAMESPACE) for node in session.status().proxies
    }
    return [node for node, actor in proxies.items() if ray.get(actor.stats.remote())["routeless"]]


def _fresh_status(url: str) -> int:
    """One request on a new connection (the kernel picks which proxy accepts it)."""
    try:
        return plain_http.get(url, timeout=10, headers=OPEN).status_code
    except httpx.HTTPError:
        return 0


def _limited(url: str, proxies: dict[str, Any]) -> dict[str, Any]:
    """Three times a key's limit of requests in one of its windows, on fresh connections
    (spread over both proxies, and the ingress replicas the head's proxy hands them to):
    what was served, what was refused, and each proxy's share."""
    before = {node: ray.get(actor.stats.remote()) for node, actor in proxies.items()}
    left = LIMIT_WINDOW_S - time.time() % LIMIT_WINDOW_S  # of the ledger's window (its clock is ours)
    if left < LIMIT_WINDOW_S / 2:  # not enough to send them all in it: the next one
        time.sleep(left + 0.05)
        left = LIMIT_WINDOW_S - time.time() % LIMIT_WINDOW_S
    started = time.monotonic()
    answers = [plain_http.get(url, timeout=10, headers={"x-api-key": LIMITED_KEY}) for _ in range(3 * LIMIT)]
    refused = [answer for answer in answers if answer.status_code == 429]
    return {
        "elapsed_s": round(time.monotonic() - started, 2),
        "window_left_s": round(left, 2),  # when the first was sent
        "served": sum(answer.status_code == 200 for answer in answers),
        "refused": len(refused),
        "headers": [
            {name: answer.headers.get(name) for name in ("retry-after", "x-ratelimit-limit-requests")}
            for answer in refused
        ],
        "connections": {
            node: sum(
                ray.get(actor.stats.remote())[key] - before[node][key] for key in ("handed_off", "served")
            )
            for node, actor in proxies.items()
        },
    }


#: When each phase of the scenario ended, in seconds since it started (the test prints them).
PHASES: dict[str, float] = {}
_STARTED = time.monotonic()


def _phase(name: str) -> None:
    """Note a phase's end; told at once on stderr too, which a scenario killed at its bound
    still leaves to read."""
    PHASES[name] = round(time.monotonic() - _STARTED, 1)
    print(f"phase: {name} at {PHASES[name]} s", file=sys.stderr, flush=True)


def main() -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    # The driver joins before the worker node exists: both nodes share 127.0.0.1, and Ray
    # 2.52 may connect a driver to either (2.60 takes the head); it must be the head's.
    ray.init(
        address=cluster.address,
        _node_ip_address="127.0.0.1",
        logging_level=logging.WARNING,
        include_dashboard=False,
    )
    worker = cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    head_id = ray.get_runtime_context().get_node_id()
    worker_id = worker.node_id
    result: dict[str, Any] = {"head": head_id, "worker": worker_id, "phases": PHASES}
    _phase("cluster of two nodes")
    try:
        session = tk.start(http_options={"port": 0, "access_log": False}, proxy_location="HeadOnly")
        result["proxies_head_only"] = session.status().proxies
        tk.shutdown()
        _phase("head-only proxies")

        session = tk.start(http_options={"port": 0, "access_log": False, "api_keys": KEYS})
        tk.run(make_where_app(), name="where", route_prefix="/")
        healthy = lambda: list(session.status().proxies.values()) == [tk.ProxyStatus.HEALTHY] * 2  # noqa: E731 - a condition
        wait_for(healthy, 60, "a proxy serving on each node")  # each STARTING first
        result["routeless"] = _routeless(session)
        status = session.status()
        result["proxies_before"] = status.proxy_urls
        result["proxy_states"] = [state.value for state in status.proxies.values()]
        url = next(iter(status.proxy_urls.values())) + "/where"
        replicas = session.status().applications["where"].deployments
        _phase("an app on both nodes")
        result["replica_nodes_before"] = sorted(r.node_id for d in replicas.values() for r in d.replicas)

        outcomes: list[Outcome] = []
        stop = threading.Event()
        loaders = [threading.Thread(target=_load, args=(url, stop, outcomes)) for _ in range(LOADERS)]
        for loader in loaders:
            loader.start()
        try:
            load_started = time.monotonic()
            wait_for(lambda: len(outcomes) >= 50 and time.monotonic() - load_started > 2, 60, "steady load")
            removed = time.monotonic()
            cluster.remove_node(worker)  # kills every process of that node

            def recovered() -> bool:
                status = session.status()
                deployments = status.applications["where"].deployments.values()
                return list(status.proxies) == [head_id] and all(
                    d.running_replicas == 2 and all(r.node_id == head_id for r in d.replicas)
                    for d in deployments
                )

            wait_for(recovered, RECOVERY_LIMIT_S, "replicas moved to the surviving node")
            _phase("a node lost, recovered")
            result["recovery_s"] = round(time.monotonic() - removed, 2)
            recovered_at = time.monotonic()
            wait_for(lambda: time.monotonic() - recovered_at > AFTER_RECOVERY_S, 10, "load after recovery")
        finally:
            stop.set()
            for loader in loaders:
                loader.join(timeout=30)
        status = session.status()
        result["proxies_after"] = status.proxies
        # Load while the node joins: its proxy takes a share of the port's new connections
        # as soon as it listens, so it must not listen before its routes arrive.
        joining: list[Outcome] = []
        stop_joining = threading.Event()
        join_loader = threading.Thread(target=_load, args=(url, stop_joining, joining))
        join_loader.start()
        try:
            joined_process, joined = _join_worker(cluster.address)
            result["joined"] = joined
            serving = lambda: session.status().proxies.get(joined) == tk.ProxyStatus.HEALTHY  # noqa: E731 - a condition
            wait_for(serving, 60, "a proxy serving on the node that joined")
            listed = time.monotonic()
            wait_for(lambda: time.monotonic() - listed > AFTER_JOIN_S, 10, "load after the join")
        finally:
            stop_joining.set()
            join_loader.join(timeout=30)
        result["during_join"] = [(o.status, o.error) for o in joining]
        result["proxies_joined"] = session.status().proxy_urls
        result["routeless_joined"] = _routeless(session)
        _phase("a node joined")
        # Both replicas run on the head now: its proxy hands connections to them; the new
        # node's proxy has no local replica and forwards what it accepts over the channel.
        proxies: dict[str, Any] = {  # Any: ray types actor methods as Never
            node: ray.get_actor(PROXY_PREFIX + node, namespace=NAMESPACE) for node in (head_id, joined)
        }
        before_stats = {node: ray.get(actor.stats.remote()) for node, actor in proxies.items()}
        result["after_join"] = [_fresh_status(url) for _ in range(40)]
        result["proxy_stats"] = {
            node: {
                key: ray.get(actor.stats.remote())[key] - before_stats[node][key]
                for key in ("handed_off", "served")
            }
            for node, actor in proxies.items()
        }
        result["limited"] = _limited(url, proxies)
        _phase("a key's limit over two proxies")
        result["replica_nodes_after"] = sorted(
            r.node_id for d in status.applications["where"].deployments.values() for r in d.replicas
        )
        result["outcomes"] = [
            {**asdict(o), "at": round(o.at - removed, 3), "ended": round(o.ended - removed, 3)}
            for o in outcomes
        ]
        result["capped"] = _capped(session)
        _phase("max_replicas_per_node")
        result["leaving"] = _leave(session, head_id, joined, joined_process)
        _phase("a node left")
        result["gpu_shaped"] = _gpu_shaped(session, cluster)
        _phase("a model's bundles on a GPU-shaped node")
        tk.shutdown()
    finally:
        print(json.dumps(result), flush=True)
        if "joined_process" in locals() and joined_process.poll() is None:
            joined_process.kill()
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]  # ray's test Cluster is unannotated


def _join_worker(address: str) -> tuple[subprocess.Popen[str], str]:
    """A worker node started as a pod starts one, ``ray start --block`` (its process is
    what gets SIGTERM: ``ray_worker_node.py``); returns the process and the node's id."""
    command = [sys.executable, "-m", "tests.integration.ray_worker_node", address, "2"]
    env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(RAY_DRAIN_S)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()  # "node <id>" once it runs (or "" if it died)
    assert line.startswith("node "), f"the worker node did not start: {line!r}"
    node = line.split()[1]
    wait_for(lambda: _alive(node), 60, "the worker node to join")
    return process, node


#: Ray drains a node whose ``ray start --block`` gets SIGTERM (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S)
#: only in newer releases; Ray 2.52 stops it at once (docs/compatibility.md).
DRAINS_ON_SIGTERM = hasattr(ray._private.ray_constants, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S")


def _drain(node: str) -> None:
    """Mark ``node`` as leaving within RAY_DRAIN_S, as an autoscaler or KubeRay does."""
    command = [
        str(Path(sys.executable).with_name("ray")), "drain-node", "--address", _gcs_address(),
        "--node-id", node, "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "leaving",
        "--deadline-remaining-seconds", str(int(RAY_DRAIN_S)),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=60)


def _gcs_address() -> str:
    return str(ray.get_runtime_context().gcs_address)


def _replicas_on(session: Any, app: str, node: str) -> int:
    deployments = session.status().applications[app].deployments.values()
    return sum(r.node_id == node for d in deployments for r in d.replicas)


def _alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())  # type: ignore[no-untyped-call]


def _gpu_shaped(session: Any, cluster: Cluster) -> dict[str, Any]:
    """A model needing two L4 GPUs: where its placement group goes, with what bundles, and
    what its deploy says where vLLM is not installed (this venv has none)."""
    import tempfile

    from ray.util import placement_group_table

    from app_toolkit._runtime.backends.ray.placement import GROUP_PREFIX
    from app_toolkit.build import build_app
    from app_toolkit.llm import build_llm_deployment

    gpus = cluster.add_node(
        num_cpus=2, num_gpus=2, resources={"accelerator_type:L4": 1.0}, node_ip_address="127.0.0.1"
    )
    folder = Path(tempfile.mkdtemp(prefix="gpu-model-"))
    (folder / "config.json").write_text("{}")  # a model folder: vLLM would read it
    model = {
        "model_loading_config": {"model_id": "big", "model_source": str(folder)},
        "accelerator_type": "L4",
        "engine_kwargs": {"tensor_parallel_size": 2},
        "deployment_config": {"health_check_period_s": 1},
    }
    session.deploy(build_app(build_llm_deployment(model), "gpu", None, session.serialize))

    def grouped() -> Any:
        groups = [
            group
            for group in placement_group_table().values()
            if group["name"].startswith(GROUP_PREFIX) and group["state"] == "CREATED"
        ]
        return groups[0] if groups else None

    group = wait_for(grouped, 60, "the model replica's placement group")

    def failed() -> Any:
        deployment = session.status().applications["gpu"].deployments["LLMServer-big"]
        return deployment if "needs vLLM" in deployment.message else None

    deployment = wait_for(failed, 90, "the deploy failing for want of vLLM")
    found = {
        "node": gpus.node_id,
        "bundles": [group["bundles"][index] for index in sorted(group["bundles"])],
        "bundle_nodes": sorted(set(group["bundles_to_node_id"].values())),
        "strategy": group["strategy"],
        "message": deployment.message,
    }
    tk.delete("gpu")
    return found


def _capped(session: Any) -> dict[str, Any]:
    """Three replicas of at most one per node on two nodes: what status says."""
    from app_toolkit.build import build_app

    app = make_where_app(num_replicas=3, max_replicas_per_node=1)
    session.deploy(build_app(app, "capped", None, session.serialize))

    def settled() -> Any:
        deployment = session.status().applications["capped"].deployments["Ingress"]
        states = sorted(r.state.value for r in deployment.replicas)
        said = "max_replicas_per_node" in deployment.message
        return deployment if states == ["RUNNING", "RUNNING", "STARTING"] and said else None

    deployment = wait_for(settled, 90, "two replicas running and a third waiting, saying why")
    found = {
        "nodes": sorted(r.node_id for r in deployment.replicas if r.state is tk.ReplicaState.RUNNING),
        "message": deployment.message,
    }
    tk.delete("capped")
    return found


def _leave(session: Any, head: str, node: str, process: subprocess.Popen[str]) -> dict[str, Any]:
    """A new application with a replica on each node, under load; then the node's
    ``ray start --block`` gets SIGTERM: what the clients and status saw, and when it went."""
    tk.run(make_where_app(graceful_shutdown_timeout_s=GRACE_S), name="moving", route_prefix="/moving")
    url = next(iter(session.status().proxy_urls.values())) + "/moving/where"
    found: dict[str, Any] = {
        "replica_nodes_before": sorted(
            r.node_id for r in session.status().applications["moving"].deployments["Ingress"].replicas
        )
    }
    outcomes: list[Outcome] = []
    stop = threading.Event()
    loaders = [threading.Thread(target=_load, args=(url, stop, outcomes, True)) for _ in range(LOADERS)]
    for loader in loaders:
        loader.start()
    signalled = time.monotonic()
    try:
        both = lambda: len({o.node for o in outcomes}) >= 2 and len(outcomes) >= 50  # noqa: E731 - a condition
        wait_for(both, 60, "both nodes serving")
        signalled = time.monotonic()
        if DRAINS_ON_SIGTERM:
            process.send_signal(signal.SIGTERM)
        else:  # older Ray: the node is drained as an autoscaler drains one, then stopped
            _drain(node)
            signalled = time.monotonic()  # the drain's start (the ray CLI took seconds to start)
        proxy: Any = ray.get_actor(PROXY_PREFIX + node, namespace=NAMESPACE)  # ray types it Never
        told = lambda: ray.get(proxy.stats.remote())["leaving"]  # noqa: E731 - a condition
        wait_for(told, 30, "the proxy told its node leaves")
        found["proxy_leaving_s"] = round(time.monotonic() - signalled, 2)
        draining = lambda: session.status().proxies.get(node) == tk.ProxyStatus.DRAINING  # noqa: E731 - a condition
        found["proxy_draining"] = wait_for(draining, 10, "status to say the leaving node's proxy drains")
        seen = lambda: node in session.status().draining_nodes  # noqa: E731 - a condition
        found["draining_seen"] = wait_for(seen, 10, "status to say the node leaves")
        if not DRAINS_ON_SIGTERM:  # stopped once the toolkit let the node go, as Ray 2.60 waits
            off = lambda: _replicas_on(session, "moving", node) == 0  # noqa: E731 - a condition
            wait_for(off, GRACE_S + 10, "the leaving node's replica stopped")
            released = lambda: node not in session.status().proxies  # noqa: E731 - a condition
            wait_for(released, GRACE_S + 10, "the leaving node's proxy released")
            found["stopped_s"] = round(time.monotonic() - signalled, 2)
            process.send_signal(signal.SIGTERM)
        wait_for(lambda: not _alive(node), RAY_DRAIN_S + 30, "the leaving node gone")
        found["node_gone_s"] = round(time.monotonic() - signalled, 2)
        process.wait(timeout=30)
        found["process_exit_s"] = round(time.monotonic() - signalled, 2)

        def moved() -> bool:
            deployment = session.status().applications["moving"].deployments["Ingress"]
            on_head = all(r.node_id == head for r in deployment.replicas)
            return deployment.running_replicas == 2 and on_head

        wait_for(moved, 60, "both replicas on the head node")
        after = time.monotonic()
        wait_for(lambda: time.monotonic() - after > 2, 10, "load after the move")
    finally:
        stop.set()
        for loader in loaders:
            loader.join(timeout=60)
    found["replica_nodes_after"] = sorted(
        r.node_id for r in session.status().applications["moving"].deployments["Ingress"].replicas
    )
    one_proxy = lambda: list(session.status().proxies) == [head]  # noqa: E731 - a condition
    try:
        wait_for(one_proxy, 30, "one proxy")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the proxies: {session.status().proxies}") from None
    found["proxies_after"] = list(session.status().proxies)
    found["outcomes"] = [
        {**asdict(o), "at": round(o.at - signalled, 3), "ended": round(o.ended - signalled, 3)}
        for o in outcomes
    ]
    return found


if __name__ == "__main__":
    main()
