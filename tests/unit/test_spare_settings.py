"""Which replicas a spare process can host, when spares are wanted (some code to load),
and the pool's size setting."""

from __future__ import annotations

from typing import Any

import pytest

from app_toolkit._runtime.backends.ray.spares import (
    SpareSetting,
    code_to_preload,
    fits,
    spare_setting,
)
from app_toolkit._runtime.controller.deployment_state import DeploymentState, follow_autoscaling
from app_toolkit._runtime.messages import DeploymentID, DeploymentSpec
from app_toolkit.config import DeploymentConfig, RayActorOptions
from app_toolkit.exceptions import ConfigError


def test_only_replicas_that_reserve_nothing_and_go_anywhere_fit_a_spare() -> None:
    def config(**actor: Any) -> DeploymentConfig:
        return DeploymentConfig(ray_actor_options=RayActorOptions(**actor))

    assert fits(config())
    assert not fits(config(num_cpus=1))
    assert not fits(config(num_gpus=0.5))
    assert not fits(config(resources={"accelerator": 1}))
    assert not fits(config(memory=1 << 30))
    assert not fits(config(runtime_env={"env_vars": {"A": "1"}}))
    assert not fits(DeploymentConfig(max_replicas_per_node=1))  # placed by a per-node resource
    assert not fits(DeploymentConfig(placement_group_bundles=[{"CPU": 1}]))  # in a group of its own


def _deployment(name: str = "D", **options: Any) -> DeploymentState:
    config = DeploymentConfig(**options)
    state = DeploymentState(
        DeploymentSpec(DeploymentID("a", name), b"def " + name.encode(), b"args", config, True, "v1")
    )
    follow_autoscaling(state)
    return state


def test_spares_are_wanted_while_a_deployment_that_fits_one_autoscales() -> None:
    scaling = {"min_replicas": 0, "max_replicas": 4}
    assert not code_to_preload([])
    assert not code_to_preload([_deployment(num_replicas=3)])  # fixed size: its replicas start once
    assert code_to_preload([_deployment(num_replicas=3), _deployment(autoscaling_config=scaling)])
    gpu = _deployment(autoscaling_config=scaling, ray_actor_options={"num_gpus": 1})
    assert not code_to_preload([gpu])  # it could not start in a spare
    leaving = _deployment(autoscaling_config=scaling)
    leaving.deleting = True
    assert not code_to_preload([leaving])


def test_spares_load_the_code_of_the_deployments_that_want_them_at_most_16() -> None:
    scaling = {"min_replicas": 0, "max_replicas": 4}
    fixed = _deployment("Fixed", num_replicas=2)
    scaled = _deployment("Scaled", autoscaling_config=scaling)
    gpu = _deployment("Gpu", autoscaling_config=scaling, ray_actor_options={"num_gpus": 1})
    assert code_to_preload([fixed, scaled, gpu]) == {"a/Scaled@v1": b"def Scaled"}
    many = [_deployment(f"D{i:02}", autoscaling_config=scaling) for i in range(20)]
    assert len(code_to_preload(many)) == 16


def test_the_pool_size_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APP_TOOLKIT_SPARE_REPLICAS", raising=False)
    assert spare_setting() == SpareSetting(1, always=False)  # one while an app autoscales
    monkeypatch.setenv("APP_TOOLKIT_SPARE_REPLICAS", "0")
    assert spare_setting() == SpareSetting(0, always=True)
    monkeypatch.setenv("APP_TOOLKIT_SPARE_REPLICAS", " 3 ")
    assert spare_setting() == SpareSetting(3, always=True)
    for bad in ("-1", "9", "two", "1.5"):
        monkeypatch.setenv("APP_TOOLKIT_SPARE_REPLICAS", bad)
        with pytest.raises(ConfigError, match="whole number from 0"):
            spare_setting()
