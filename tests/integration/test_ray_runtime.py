"""Behaviour that exists only on Ray: resources, actor death, checkpoints, shutdown."""

from __future__ import annotations

import os
import threading
from typing import Any

import httpx
import pytest
import ray

import app_toolkit as tk
from app_toolkit._runtime.backends.ray import stored
from app_toolkit._runtime.backends.ray.cluster import (
    CONTROLLER_NAME,
    MALLOC_ENV,
    NAMESPACE,
    REPLICA_PREFIX,
    SPARE_PREFIX,
    named_actors,
)
from app_toolkit._runtime.backends.ray.stored import CHECKPOINT_KEY
from app_toolkit._runtime.controller import checkpoint
from tests import plain_http
from tests.apps import basic, ray_only, scaling, serve_compat
from tests.conftest import TEST_RESOURCE, Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for as wait_until


def test_ray_actor_options_reach_ray(ray_toolkit: Toolkit) -> None:
    name = ray_toolkit.name()
    handle = ray_toolkit.run(as_deployment(ray_only.Resourced).bind(), name=name, route_prefix=None)
    assigned = handle.assigned.remote().result(timeout_s=30)
    assert assigned["CPU"] == 0.5
    assert assigned[TEST_RESOURCE] == 0.5


def test_deploy_is_checkpointed_in_gcs(ray_toolkit: Toolkit) -> None:
    name = ray_toolkit.name()
    ray_toolkit.run(as_deployment(ray_only.Pid).bind(), name=name, route_prefix=None)
    stored = ray.experimental.internal_kv._internal_kv_get(CHECKPOINT_KEY, namespace=NAMESPACE)
    saved = checkpoint.loads(stored)
    assert saved is not None and name in saved.apps


def _kill_one_replica(handle: tk.DeploymentHandle) -> str:
    replicas: set[tuple[str, int]] = wait_until(
        lambda: (
            len(found := {handle.identity.remote().result(timeout_s=10) for _ in range(20)}) == 2 and found
        ),
        what="both replicas answering",
    )
    victim, pid = sorted(replicas)[0]
    ray.kill(ray.get_actor(victim, namespace=NAMESPACE), no_restart=True)

    def exited() -> bool:
        # ray.kill returns before the process is gone; until it is, a request sent to
        # it may really start (and then fail with ReplicaUnavailableError / 503).
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(exited, what="the killed replica's process to exit")
    return victim.split(":", 1)[1]


def test_requests_not_started_avoid_a_dead_replica(ray_toolkit: Toolkit) -> None:
    # A long health-check period keeps the dead replica in every routing table, so
    # each caller must find out for itself (connection refused) and go elsewhere.
    name = ray_toolkit.name()
    handle = ray_toolkit.run(
        as_deployment(ray_only.Pid).options(health_check_period_s=60).bind(), name=name, route_prefix=None
    )
    _kill_one_replica(handle)
    results = {handle.remote().result(timeout_s=10) for _ in range(30)}
    assert len(results) == 1  # every request served, all by the survivor


def test_a_dead_replica_is_replaced(ray_toolkit: Toolkit) -> None:
    name = ray_toolkit.name()
    handle = ray_toolkit.run(as_deployment(ray_only.Pid).bind(), name=name, route_prefix=None)
    victim = _kill_one_replica(handle)

    def replaced() -> bool:
        deployment = tk.status().applications[name].deployments["Pid"]
        ids = {replica.replica_id for replica in deployment.replicas}
        return deployment.replica_states == {"RUNNING": 2} and victim not in ids

    wait_until(replaced, what="a replacement replica")
    assert {handle.remote().result(timeout_s=10) for _ in range(20)}


def test_a_killed_controller_restarts_adopts_its_replicas_and_finishes_a_rollout(
    ray_toolkit: Toolkit,
) -> None:
    name = ray_toolkit.name()
    ray_toolkit.run(basic.make_versioned_app("v1", num_replicas=2), name=name, route_prefix="/restart")

    def replica_ids() -> set[str]:
        return {r.replica_id for r in tk.status().applications[name].deployments["Ingress"].replicas}

    def kill_controller() -> None:  # the process dies; Ray restarts the actor
        ray.kill(ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE), no_restart=False)

    first = replica_ids()
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=ray_toolkit.url, timeout=30) as client:
            while not stop.is_set():
                # Each request held 50 ms: requests stay in flight while the controller
                # dies, and the clients do not spin a core for the test's length.
                response = client.get("/restart/version", params={"seconds": 0.05})
                seen.append(
                    (
                        response.status_code,
                        response.json().get("version", "?") if response.status_code == 200 else response.text,
                    )
                )

    workers = [threading.Thread(target=load) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        wait_until(lambda: len(seen) > 20, what="load to run")
        kill_controller()
        wait_until(
            lambda: tk.status().applications[name].status is tk.ApplicationStatus.RUNNING,
            timeout_s=60,
            what="the restarted controller to report the app",
        )
        assert replica_ids() == first  # adopted, not restarted
        # Kill it again in the middle of a rollout to v2: the rollout still completes.
        rollout = threading.Thread(
            target=ray_toolkit.run,
            args=(basic.make_versioned_app("v2", num_replicas=2),),
            kwargs={"name": name, "route_prefix": "/restart"},
        )
        rollout.start()
        wait_until(lambda: replica_ids() - first, what="the rollout to start")
        kill_controller()
        rollout.join(timeout=120)
        assert not rollout.is_alive()
        wait_until(
            lambda: seen[-1][1] == "v2" and not (replica_ids() & first), timeout_s=60, what="v2 to replace v1"
        )
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=30)
    failures = [item for item in seen if item[0] != 200]
    assert not failures, f"{len(failures)} of {len(seen)} requests failed, e.g. {failures[:3]}"
    alive = replica_processes()
    wait_until(lambda: replica_processes() == replica_ids(), what="no replica left over")
    assert alive


def replica_processes() -> set[str]:
    """The replica ids of the replica actors alive (named after their replica, or spare
    processes given one)."""
    found = set()
    for name in named_actors():
        if name.startswith(REPLICA_PREFIX):
            found.add(name[len(REPLICA_PREFIX) :])
        elif name.startswith(SPARE_PREFIX):
            try:
                spare: Any = ray.get_actor(name, namespace=NAMESPACE)  # Any: ray types actor methods as Never
                becomes = ray.get(spare.replica_id.remote(), timeout=30)
            except (ValueError, ray.exceptions.RayActorError):
                continue  # an idle spare stopped meanwhile
            if becomes is not None:
                found.add(becomes)
    return found


def test_a_ray_serve_program_runs_unchanged(ray_toolkit: Toolkit) -> None:
    serve = tk  # what serve_compat imports as serve
    name = ray_toolkit.name()
    ray_toolkit._apps.append(name)
    api = as_deployment(serve_compat.Api).bind(as_deployment(serve_compat.Doubler).bind())
    handle = serve.run(api, name=name, route_prefix="/compat")
    assert isinstance(handle, serve.DeploymentHandle)
    with ray_toolkit.client() as client:
        assert client.get("/compat/double/21").json() == 42
    assert serve.status().applications[name].status == "RUNNING"
    assert serve.get_deployment_handle("Doubler", name).double.remote(4).result() == 8

    slow_name = ray_toolkit.name()
    ray_toolkit._apps.append(slow_name)
    slow = serve.run(as_deployment(serve_compat.Slow).bind(), name=slow_name, route_prefix=None)
    assert slow.remote(0).result() == "done"  # the caller now knows the replica table
    responses = [slow.remote(1.0) for _ in range(3)]
    outcomes = []
    for response in responses:
        try:
            outcomes.append(response.result(timeout_s=30))
        except serve.BackPressureError:
            outcomes.append("backpressure")
    assert sorted(outcomes) == ["backpressure", "done", "done"]

    serve.delete(name)
    assert name not in serve.status().applications


def test_shutdown_stops_everything(spares_ray_toolkit: Toolkit) -> None:
    import httpx

    spares_ray_toolkit.run(as_deployment(ray_only.Pid).bind(), route_prefix="/pid")
    # An autoscaling application: the pool keeps a spare, which shutdown must stop too.
    spares_ray_toolkit.run(scaling.make_app(), name=spares_ray_toolkit.name(), route_prefix="/scaling")
    spares_ray_toolkit._apps.clear()
    wait_until(lambda: sum(tk.status().spare_replicas.values()) == 1, what="a spare replica process")
    tk.shutdown()
    with pytest.raises(httpx.ConnectError):
        plain_http.get(spares_ray_toolkit.url + "/-/healthz", timeout=5)
    actors = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]
    assert actors == []
    # Nothing left for a proxy to start from later.
    assert stored.load_tables() is None and stored.load_proxy_port() is None


def test_omp_threads_follow_the_replicas_cpus_unless_set(ray_toolkit: Toolkit) -> None:
    # Ray sets OMP_NUM_THREADS in each replica from its num_cpus (at least 1), so CPU-bound
    # libraries do not start a thread per core in every replica; the user's value wins.
    def omp(**actor: Any) -> str | None:
        threads = as_deployment(basic.Threads).options(ray_actor_options=actor)
        name = ray_toolkit.name()
        handle = ray_toolkit.run(threads.bind(), name=name, route_prefix=None)
        result: str | None = handle.omp.remote().result(timeout_s=60)
        tk.delete(name)  # free its CPUs (the test cluster has 2)
        return result

    assert omp() == "1"  # num_cpus defaults to 0 here
    assert omp(num_cpus=2) == "2"
    assert omp(num_cpus=0.5, runtime_env={"env_vars": {"OMP_NUM_THREADS": "3"}}) == "3"


def test_replicas_keep_big_bodies_in_the_heap_and_their_startup_objects_frozen(ray_toolkit: Toolkit) -> None:
    # glibc would otherwise hand a freed request body's pages back to the kernel, and fault
    # them in again for the next body (docs/deploy.md, "Large request bodies").
    environment = as_deployment(ray_only.Environment)
    handle = ray_toolkit.run(environment.bind(), name=ray_toolkit.name(), route_prefix=None)
    for name, value in MALLOC_ENV.items():
        assert handle.get.remote(name).result(timeout_s=30) == value
    # What the replica held once started is out of the collector's reach (no full
    # collection walks it mid-request).
    assert handle.frozen.remote().result(timeout_s=30) > 10_000
