"""Which replicas a spare process can host, and the pool's size setting."""

from __future__ import annotations

import pytest

from app_toolkit._runtime.backends.ray.spares import fits, spares_per_node
from app_toolkit.config import RayActorOptions
from app_toolkit.exceptions import ConfigError


def test_only_replicas_that_reserve_nothing_fit_a_spare() -> None:
    assert fits(RayActorOptions())
    assert not fits(RayActorOptions(num_cpus=1))
    assert not fits(RayActorOptions(num_gpus=0.5))
    assert not fits(RayActorOptions(resources={"accelerator": 1}))
    assert not fits(RayActorOptions(memory=1 << 30))
    assert not fits(RayActorOptions(runtime_env={"env_vars": {"A": "1"}}))


def test_the_pool_size_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APP_TOOLKIT_SPARE_REPLICAS", raising=False)
    assert spares_per_node() == 1
    monkeypatch.setenv("APP_TOOLKIT_SPARE_REPLICAS", "0")
    assert spares_per_node() == 0
    monkeypatch.setenv("APP_TOOLKIT_SPARE_REPLICAS", " 3 ")
    assert spares_per_node() == 3
    for bad in ("-1", "9", "two", "1.5"):
        monkeypatch.setenv("APP_TOOLKIT_SPARE_REPLICAS", bad)
        with pytest.raises(ConfigError, match="whole number from 0"):
            spares_per_node()
