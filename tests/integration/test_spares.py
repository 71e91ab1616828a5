"""Spare replica processes on Ray (backends/ray/spares.py): a replica started from zero
runs in a process that was started ahead, the pool keeps its bound, replaces what it
gave away, keeps spares only while an application autoscales (by default) and is
stopped with the toolkit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import ray

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import (
    NAMESPACE,
    REPLICA_PREFIX,
    SPARE_PREFIX,
    named_actors,
    replica_actor,
)
from tests.apps import scaling
from tests.conftest import ROOT, Toolkit
from tests.waiting import wait_for

#: Spares each node keeps by default (the test cluster has one node).
PER_NODE = 1
#: Generous for a loaded 2-core CI machine; a spare makes it ~0.15 s here, a fresh
#: process ~0.75 s (benchmarks/autoscaling.py).
FIRST_ANSWER_BOUND_S = 10.0


def ready_spares() -> int:
    return sum(tk.status().spare_replicas.values())


def waiting_spares() -> list[str]:
    """Names of the (live) spare processes not given a replica."""
    found = []
    for name in named_actors():
        if name.startswith(SPARE_PREFIX):
            try:
                spare: Any = ray.get_actor(name, namespace=NAMESPACE)  # Any: ray types actor methods as Never
                becomes = ray.get(spare.replica_id.remote(), timeout=30)
            except (ValueError, ray.exceptions.RayActorError):
                continue  # died, and not yet forgotten by Ray
            if becomes is None:
                found.append(name)
    return found


def keep_spares_wanted(toolkit: Toolkit) -> None:
    """Deploy an idle autoscaling application, so the pool keeps its spares (with the
    default setting, spares are kept only while something autoscales)."""
    toolkit.run(scaling.make_app(), name=toolkit.name(), route_prefix="/keeper")


def test_a_replica_from_zero_starts_in_a_spare_and_the_spare_is_replaced(spares_ray_toolkit: Toolkit) -> None:
    name = spares_ray_toolkit.name()
    spares_ray_toolkit.run(scaling.make_app(), name=name, route_prefix="/spare")
    wait_for(lambda: ready_spares() == PER_NODE, 60, "a spare replica process")
    [spare] = waiting_spares()
    spare_actor: Any = ray.get_actor(spare, namespace=NAMESPACE)  # Any: ray types actor methods as Never
    spare_pid = ray.get(spare_actor.stats.remote(), timeout=30)["pid"]

    started = time.monotonic()
    with spares_ray_toolkit.client() as client:  # zero replicas: the request waits, never fails
        response = client.get("/spare/work", params={"seconds": 0})
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert elapsed < FIRST_ANSWER_BOUND_S

    replica_id = response.json()["replica"]
    actor = replica_actor(replica_id)
    assert ray.get(actor.stats.remote(), timeout=30)["pid"] == spare_pid  # the spare's own process
    assert REPLICA_PREFIX + replica_id not in named_actors()
    phases = ray.get(actor.start_phases.remote(), timeout=30)
    assert set(phases) == {"code", "constructor", "channel", "front", "heap"}
    # The pool starts a new spare for the one it gave away.
    wait_for(lambda: ready_spares() == PER_NODE and len(waiting_spares()) == PER_NODE, 60, "a new spare")
    assert waiting_spares() != [spare]


def test_the_pool_never_holds_more_than_its_bound(spares_ray_toolkit: Toolkit) -> None:
    counts: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            counts.append(max(tk.status().spare_replicas.values(), default=0))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # Three replicas at once, then two more: spares go, and come back, several times.
        name = spares_ray_toolkit.name()
        kit = spares_ray_toolkit
        kit.run(scaling.make_app(min_replicas=3, max_replicas=3), name=name, route_prefix="/many")
        kit.run(scaling.make_app(min_replicas=5, max_replicas=5), name=name, route_prefix="/many")
        wait_for(lambda: ready_spares() == PER_NODE, 60, "the spares to be replaced")
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert counts and max(counts) <= PER_NODE
    assert len(waiting_spares()) <= PER_NODE


def test_a_bad_spares_setting_fails_with_how_to_fix_it() -> None:
    # In a process of its own: this session's toolkit already runs.
    program = "import app_toolkit as tk; tk.start(backend='ray')"
    env = {**os.environ, "APP_TOOLKIT_SPARE_REPLICAS": "lots", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "APP_TOOLKIT_SPARE_REPLICAS='lots'" in result.stderr
    assert "from 0" in result.stderr


def test_a_restarted_controller_adopts_replicas_in_spares_and_stops_idle_spares(
    spares_ray_toolkit: Toolkit,
) -> None:
    from app_toolkit._runtime.backends.ray.cluster import CONTROLLER_NAME

    name = spares_ray_toolkit.name()
    keep_spares_wanted(spares_ray_toolkit)
    wait_for(lambda: ready_spares() == PER_NODE, 60, "a spare replica process")
    spares_ray_toolkit.run(scaling.make_app(min_replicas=1, max_replicas=1), name=name, route_prefix="/adopt")
    [replica] = tk.status().applications[name].deployments["Ingress"].replicas
    assert REPLICA_PREFIX + replica.replica_id not in named_actors()  # it runs in the spare
    wait_for(lambda: len(waiting_spares()) == PER_NODE, 60, "the spare to be replaced")
    [idle] = waiting_spares()

    ray.kill(ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE), no_restart=False)

    def adopted() -> bool:
        app = tk.status().applications.get(name)
        return app is not None and app.status is tk.ApplicationStatus.RUNNING

    wait_for(adopted, 60, "the restarted controller to report the app")
    assert [r.replica_id for r in tk.status().applications[name].deployments["Ingress"].replicas] == [
        replica.replica_id
    ]
    with spares_ray_toolkit.client() as client:
        assert client.get("/adopt/work", params={"seconds": 0}).json()["replica"] == replica.replica_id
    # The previous life's idle spare is stopped; the new controller keeps one of its own.
    wait_for(lambda: idle not in named_actors(), 60, "the old spare to stop")
    wait_for(lambda: len(waiting_spares()) == PER_NODE, 60, "a new spare")


def test_a_spare_that_died_is_replaced_and_one_dying_unseen_is_passed_over(
    spares_ray_toolkit: Toolkit,
) -> None:
    def kill_the_spare() -> str:
        wait_for(lambda: ready_spares() == PER_NODE and len(waiting_spares()) == PER_NODE, 60, "a spare")
        [spare] = waiting_spares()
        spare_actor: Any = ray.get_actor(spare, namespace=NAMESPACE)  # Any: ray types actor methods as Never
        pid = ray.get(spare_actor.stats.remote(), timeout=30)["pid"]
        os.kill(pid, signal.SIGKILL)
        return spare

    keep_spares_wanted(spares_ray_toolkit)
    # The pool asks its ready spares every 10 s whether they live, and replaces a dead one.
    dead = kill_the_spare()
    wait_for(lambda: waiting_spares() not in ([], [dead]) and ready_spares() == PER_NODE, 60, "a new spare")
    # A replica that starts before the pool noticed: it starts in a process of its own.
    kill_the_spare()
    name = spares_ray_toolkit.name()
    spares_ray_toolkit.run(scaling.make_app(min_replicas=1, max_replicas=1), name=name, route_prefix="/dead")
    with spares_ray_toolkit.client() as client:
        assert client.get("/dead/work", params={"seconds": 0}).status_code == 200


def test_spares_are_kept_only_while_an_application_autoscales(spares_ray_toolkit: Toolkit) -> None:
    keeper = spares_ray_toolkit.name()
    spares_ray_toolkit.run(scaling.make_app(), name=keeper, route_prefix="/keeper")
    wait_for(lambda: ready_spares() == PER_NODE, 60, "a spare while an application autoscales")
    tk.delete(keeper)
    # Nothing autoscales: the spare stops (10 s after; longer is a CI machine's slowness).
    wait_for(lambda: not waiting_spares() and not tk.status().spare_replicas, 60, "the spare to stop")

    # A fixed-size application gets no spare: its replicas start once, in their own processes.
    fixed = tk.App(scaling.router, name="fixed", num_replicas=2)
    spares_ray_toolkit.run(fixed, name=spares_ray_toolkit.name(), route_prefix="/fixed")
    with spares_ray_toolkit.client() as client:
        assert client.get("/fixed/work", params={"seconds": 0}).status_code == 200
    deadline = time.monotonic() + 3  # the pool looks every second
    while time.monotonic() < deadline:
        assert not waiting_spares() and not tk.status().spare_replicas
        time.sleep(0.2)


def test_a_spare_loads_the_code_of_autoscaled_deployments_ahead(spares_ray_toolkit: Toolkit) -> None:
    from tests.apps import slow_import  # its import takes IMPORT_S (here, in the driver, too)

    name = spares_ray_toolkit.name()
    spares_ray_toolkit.run(slow_import.make_app(), name=name, route_prefix="/slow")

    def preloaded_spare() -> bool:  # one that loaded this app's code (others' may be there too)
        for spare in waiting_spares():
            actor: Any = ray.get_actor(spare, namespace=NAMESPACE)  # Any: ray types actor methods as Never
            try:
                loaded = ray.get(actor.loaded_ahead.remote(), timeout=30)
            except (ValueError, ray.exceptions.RayActorError):
                continue
            if any(key.startswith(f"{name}/") for key in loaded):
                return True
        return False

    wait_for(preloaded_spare, 60, "a spare that loaded the deployment's code")
    with spares_ray_toolkit.client() as client:
        response = client.get("/slow/work")
    assert response.status_code == 200, response.text
    phases = ray.get(replica_actor(response.json()["replica"]).start_phases.remote(), timeout=30)
    # Loading its code found the module imported: far less than the import itself takes.
    assert phases["code"] < slow_import.IMPORT_S / 2, phases
