"""Shard keys on a real local Ray cluster when a replica dies: its keys move (to the
other replicas, then to its replacement, which takes its rank), every other key stays."""

from __future__ import annotations

import os
import signal

import ray

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import replica_actor
from tests.apps import sharded
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for

KEYS = [f"chat-{i}" for i in range(60)]


def _placement(handle: tk.DeploymentHandle) -> dict[str, str]:
    return {key: handle.options(shard_key=key).remote().result(timeout_s=30) for key in KEYS}


def test_a_killed_replica_s_keys_go_to_its_replacement_and_the_rest_stay(ray_toolkit: Toolkit) -> None:
    name = ray_toolkit.name()
    who = as_deployment(sharded.Who).options(health_check_period_s=0.5, health_check_timeout_s=2)
    handle = ray_toolkit.run(who.bind(), name=name)
    before = _placement(handle)
    assert len(set(before.values())) == 4
    victim = before[KEYS[0]]
    actor = replica_actor(victim)
    pid = ray.get(actor.stats.remote(), timeout=30)["pid"]
    os.kill(pid, signal.SIGKILL)  # a replica this test deployed

    def replaced() -> list[str]:
        replicas = tk.status().applications[name].deployments["Who"].replicas
        running = [r.replica_id for r in replicas if r.state.value == "RUNNING"]
        return running if len(running) == 4 and victim not in running else []

    running = wait_for(replaced, 60, "the replacement to run")
    (replacement,) = set(running) - set(before.values())
    # Give this caller the new table (the handle follows the controller's long poll).
    wait_for(lambda: replacement in set(_placement(handle).values()), 30, "the replacement to get keys")
    after = _placement(handle)
    for key in KEYS:
        assert after[key] == (replacement if before[key] == victim else before[key]), key
