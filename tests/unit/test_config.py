"""One schema validates every option, with errors that say how to fix them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import app_toolkit as tk
from app_toolkit.config import parse_application_options, parse_http_options
from app_toolkit.import_path import colon_form, import_attr, split_import_path
from tests.deployments import as_deployment


def test_defaults_are_finite() -> None:
    config = tk.DeploymentConfig()
    assert config.num_replicas == 1
    assert config.max_ongoing_requests >= 1
    assert config.max_queued_requests > 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"max_ongoing_requests": 0},
            "max_ongoing_requests Input should be greater than or equal to 1, got 0",
        ),
        ({"num_replicas": -1}, "num_replicas Input should be greater than or equal to 0, got -1"),
        ({"max_queued_requests": -2}, "max_queued_requests .* got -2"),
        ({"health_check_period_s": 0}, "health_check_period_s .* got 0"),
        ({"ray_actor_options": {"num_gpus": -0.5}}, "ray_actor_options.num_gpus .* got -0.5"),
        ({"ray_actor_options": {"gpus": 1}}, "unknown option 'ray_actor_options.gpus'"),
        ({"num_replica": 2}, "unknown option 'num_replica'"),
        # Ray Serve's upgrade and placement options, with its types and ranges.
        ({"rolling_update_percentage": 0}, "rolling_update_percentage Input should be greater than 0"),
        ({"rolling_update_percentage": 1.5}, "rolling_update_percentage .* less than or equal to 1"),
        ({"max_surge_percent": 101}, "max_surge_percent .* less than or equal to 100"),
        ({"max_surge_percent": 2.5}, "max_surge_percent Input should be a valid integer"),
        ({"max_replicas_per_node": 0}, "max_replicas_per_node .* greater than or equal to 1, got 0"),
        ({"max_replicas_per_node": 101}, "max_replicas_per_node .* less than or equal to 100"),
        ({"placement_group_strategy": "SPREAD"}, "placement_group_strategy needs placement_group_bundles"),
        (
            {"placement_group_bundles": [{"CPU": 1}], "placement_group_strategy": "WIDE"},
            "placement_group_strategy Input should be 'PACK', 'SPREAD', 'STRICT_PACK' or 'STRICT_SPREAD'",
        ),
        ({"placement_group_bundles": []}, "must list at least one bundle"),
        (
            {"placement_group_bundles": [{"CPU": 1}, {"GPU": 0}]},
            r"placement_group_bundles\[1\] reserves nothing",
        ),
        (
            {"placement_group_bundles": [{"CPU": 1}], "max_replicas_per_node": 1},
            "Setting max_replicas_per_node is not allowed when placement_group_bundles is provided",
        ),
        (
            {
                "placement_group_bundles": [{"CPU": 1}, {"accel": 1}],
                "ray_actor_options": {"resources": {"accel": 1}},
            },
            "resources\\['accel'\\] is 1 but the first bundle has 0 accel",
        ),
        (
            {"placement_group_bundles": [{"CPU": 1}], "ray_actor_options": {"num_cpus": 2}},
            "num_cpus is 2 but the first bundle has 1 CPU; add it to the first bundle or lower num_cpus",
        ),
        (
            {"max_queued_requests": 0, "autoscaling_config": {"min_replicas": 0}},
            "at zero replicas every request would be refused and none would start a replica",
        ),
    ],
)
def test_bad_options_fail_fast_with_the_option_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(tk.ConfigError, match=message):

        @tk.deployment(**options)
        class Model:
            pass


@pytest.mark.parametrize(
    ("autoscaling", "message"),
    [
        (
            {"metrics_interval_s": 0},
            "autoscaling_config.metrics_interval_s Input should be greater than 0, got 0",
        ),
        (
            {"smoothing_factor": 0},
            "autoscaling_config.smoothing_factor Input should be greater than 0, got 0",
        ),
        ({"upscale_smoothing_factor": -1}, "autoscaling_config.upscale_smoothing_factor .* got -1"),
        ({"downscale_smoothing_factor": 0}, "autoscaling_config.downscale_smoothing_factor .* got 0"),
        (
            {"aggregation_function": "median"},
            "autoscaling_config.aggregation_function Input should be 'mean', 'max'",
        ),
        (
            {"policy": {"policy_function": "no_colon"}},
            "autoscaling_config.policy.policy_function must be a function",
        ),
        (
            {"policy": {"policy_function": "m:f", "kind": 1}},
            "unknown option 'autoscaling_config.policy.kind'",
        ),
        ({"prometheus_metrics": ["x"]}, "unknown option 'autoscaling_config.prometheus_metrics'"),
    ],
)
def test_autoscaling_options_are_checked_by_name(autoscaling: dict[str, Any], message: str) -> None:
    with pytest.raises(tk.ConfigError, match=message):
        tk.deployment(autoscaling_config=autoscaling)(lambda: None)


def test_ray_serve_autoscaling_options_and_their_fallbacks() -> None:
    """Ray Serve's names, defaults and deprecated fallbacks: the factors fall back to the
    smoothing factors; the aggregation is case-insensitive; a policy is a function or an
    import path in either of Ray Serve's forms, and its built-in name is the default."""
    config = tk.AutoscalingConfig()
    assert (config.metrics_interval_s, config.aggregation_function, config.smoothing_factor) == (
        10.0,
        "mean",
        1.0,
    )
    assert config.policy.is_default and (config.upscale_factor, config.downscale_factor) == (1.0, 1.0)
    smooth = tk.AutoscalingConfig(smoothing_factor=2, downscale_smoothing_factor=0.5)
    assert (smooth.upscale_factor, smooth.downscale_factor) == (2, 0.5)
    assert tk.AutoscalingConfig(upscale_smoothing_factor=3, upscaling_factor=0.5).upscale_factor == 0.5
    assert tk.AutoscalingConfig(aggregation_function="MAX").aggregation_function == "max"
    for path in ("tests.apps.policies:scale_on_metric", "tests.apps.policies.scale_on_metric"):
        assert not tk.AutoscalingPolicy(policy_function=path).is_default

    def mine(context: tk.AutoscalingContext) -> tuple[int, dict[str, Any]]:
        return 1, {}

    moved = tk.deployment(num_replicas="auto")(lambda: None).options(
        autoscaling_config={"policy": tk.AutoscalingPolicy(policy_function=mine)}
    )
    config_in_code = moved.config.autoscaling_config
    assert config_in_code is not None and config_in_code.policy.policy_function is mine
    dumped = config_in_code.model_dump(mode="json")["policy"]["policy_function"]
    assert dumped.endswith(":test_ray_serve_autoscaling_options_and_their_fallbacks.<locals>.mine")


def test_options_merge_and_validate() -> None:
    @tk.deployment(num_replicas=2, ray_actor_options={"num_gpus": 0.5, "memory": 1024})
    class Model:
        pass

    changed = as_deployment(Model).options(max_ongoing_requests=3, name="Other")
    assert (changed.name, changed.config.num_replicas, changed.config.max_ongoing_requests) == ("Other", 2, 3)
    assert changed.config.ray_actor_options.num_gpus == 0.5
    assert as_deployment(Model).config.max_ongoing_requests == 100
    with pytest.raises(tk.ConfigError, match="max_ongoing_requests"):
        as_deployment(Model).options(max_ongoing_requests="many")


def test_deployments_cannot_be_called_or_decorated_twice() -> None:
    @tk.deployment
    def f() -> int:
        return 1

    with pytest.raises(tk.ConfigError, match=r"use f.bind\(...\)"):
        f()
    with pytest.raises(tk.ConfigError, match="applied twice"):
        tk.deployment(f)
    with pytest.raises(tk.ConfigError, match="takes no constructor arguments"):
        f.bind(1)


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("api", "must start with a forward slash"),
        ("/api/", "may not end with a trailing"),
        ("/{x}", "may not contain wildcards"),
        ("/-", "may not be under '/-/'"),
        ("/-/mine", "may not be under '/-/'"),
    ],
)
def test_route_prefix_rules(prefix: str, message: str) -> None:
    with pytest.raises(tk.ConfigError, match=message):
        parse_application_options("app", prefix)
    assert parse_application_options("app", None).route_prefix is None


def test_http_options_and_app_names() -> None:
    assert parse_http_options({"port": 0}).port == 0
    with pytest.raises(tk.ConfigError, match="port"):
        parse_http_options({"port": 70000})
    assert parse_http_options({}).proxy_location == "EveryNode"
    assert parse_http_options({"proxy_location": "Disabled"}).proxy_location == "Disabled"
    with pytest.raises(tk.ConfigError, match="proxy_location.*'EveryNode', 'HeadOnly' or 'Disabled'"):
        parse_http_options({"proxy_location": "Everywhere"})
    with pytest.raises(tk.ConfigError, match="letters, digits"):
        parse_application_options("my app", "/")


def test_import_paths_say_what_they_must_look_like() -> None:
    with pytest.raises(tk.ConfigError, match='must look like "module:attribute" or "module.attribute"'):
        import_attr("demo")
    with pytest.raises(tk.ConfigError, match='Could not import module "no_such_module_xyz"'):
        import_attr("no_such_module_xyz:app")
    with pytest.raises(tk.ConfigError, match='has no attribute "nope"'):
        import_attr("examples.demo:nope")
    assert isinstance(import_attr("examples.demo:app"), tk.Application)


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        ("chat.app:app", ("chat.app", "app")),
        ("chat.app:Model.bind", ("chat.app", "Model.bind")),  # after a colon, a dotted attribute
        ("chat.app.app", ("chat.app", "app")),  # no colon: split at the last dot
        (
            "ray.serve.llm.request_router.PrefixCacheAffinityRouter",
            ("ray.serve.llm.request_router", "PrefixCacheAffinityRouter"),
        ),
    ],
)
def test_import_paths_are_split_as_rays_import_attr_splits_them(path: str, parts: tuple[str, str]) -> None:
    assert split_import_path(path) == parts
    assert colon_form(path) == ":".join(parts)


@pytest.mark.parametrize(
    "path", ["app", "", "a:b:c", "no colon", ":app", "chat.app:", "chat.", ".app", "a..b"]
)
def test_a_malformed_import_path_is_refused_naming_both_forms(path: str) -> None:
    with pytest.raises(
        tk.ConfigError, match=f'"{path}" must look like "module:attribute" or "module.attribute"'
    ):
        split_import_path(path)


def test_a_dotted_import_path_imports_what_its_colon_form_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert import_attr("examples.demo.app") is import_attr("examples.demo:app")
    with pytest.raises(tk.ConfigError, match='Module "examples.demo" has no attribute "nope"'):
        import_attr("examples.demo.nope")
    # A module not imported yet, named as if it were the attribute: how to name what is in it.
    package = tmp_path / "dotted_paths_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "chat.py").write_text("app = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        tk.ConfigError,
        match='"dotted_paths_pkg.chat" is a module: name what in it to import, e.g. '
        '"dotted_paths_pkg.chat:app"',
    ):
        import_attr("dotted_paths_pkg.chat")
    assert import_attr("dotted_paths_pkg.chat.app") == 1


def test_each_option_has_one_home() -> None:
    """Defaults, help and "applies in place" live on the pydantic fields; the decorator,
    the CLI and the code version read them from there."""
    import inspect

    import click

    from app_toolkit.cli.serve import run

    assert tk.DeploymentConfig.in_place_options() == {
        "num_replicas",
        "autoscaling_config",
        "max_ongoing_requests",
        "max_queued_requests",
        "backpressure_config",
        "affinity",
        "request_router_config",  # read by the callers, from the next table
        "user_config",
        "health_check_period_s",
        "health_check_timeout_s",
        "health_check_failure_threshold",
        "graceful_shutdown_wait_loop_s",
        "graceful_shutdown_timeout_s",
        "rolling_update_percentage",
        "max_surge_percent",
        "surge_timeout_s",
        "continuation_wait_s",  # read by the callers, from the next table
        "logging_config",  # a replica takes a new level and format as it runs
    }  # ray_actor_options and placement are not: new resources need new replicas
    batch_defaults = {
        name: p.default
        for name, p in inspect.signature(tk.batch).parameters.items()
        if name in tk.BatchConfig.model_fields
    }
    assert batch_defaults == tk.BatchConfig().model_dump()
    flags = {p.name: p for p in run.params if isinstance(p, click.Option)}
    for name in ("host", "port", "access_log", "proxy_location"):
        field = tk.HTTPOptions.model_fields[name]
        assert flags[name].default == field.default and flags[name].help == field.description
    assert isinstance(flags["proxy_location"].type, click.Choice)
    assert list(flags["proxy_location"].type.choices) == ["EveryNode", "HeadOnly", "Disabled"]
