"""Deploy config files: Ray Serve's schema, validated whole before anything deploys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import app_toolkit as tk
from app_toolkit.build import build_spec, describe
from app_toolkit.config.file import BLANKED, dump_config, load_config, parse_config
from app_toolkit.config.request_router import PREFIX_AWARE

#: What `serve build` of Ray Serve 2.x writes (neutral gRPC and logging sections included).
RAY_SERVE_BUILT = """
proxy_location: EveryNode
http_options:
  host: 0.0.0.0
  port: 8000
grpc_options:
  port: 9000
  grpc_servicer_functions: []
logging_config:
  encoding: TEXT
  log_level: INFO
  logs_dir: null
  enable_access_log: true
  additional_log_standard_attrs: []
applications:
- name: app1
  route_prefix: /
  import_path: tests.apps.config_apps:build
  runtime_env: {}
  args: {greeting: Bonjour}
  deployments:
  - name: Greeter
    num_replicas: auto
    user_config: {punctuation: "."}
    ray_actor_options: {num_cpus: 0.5}
"""


def _app(**entry: Any) -> dict[str, Any]:
    return {"applications": [{"name": "a", "import_path": "tests.apps.config_apps:hello", **entry}]}


def test_a_file_ray_serve_build_wrote_loads(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(RAY_SERVE_BUILT)
    config = load_config(path)
    assert config.http().host == "0.0.0.0" and config.http().proxy_location == "EveryNode"
    assert config.logging_config.level_name() == "info"
    (app,) = config.applications
    assert app.args == {"greeting": "Bonjour"}
    assert app.deployments[0].options["num_replicas"] == "auto"
    assert config.as_written() == yaml.safe_load(RAY_SERVE_BUILT)


def test_the_file_kept_as_written_holds_no_secret_of_the_http_options() -> None:
    """The controller stores the file as written, and app-toolkit config prints it: the
    dashboard token and the key password are not kept (the rest is as written)."""
    data = yaml.safe_load(RAY_SERVE_BUILT)
    data["http_options"] = {**data.get("http_options", {}), "dashboard_token": "a-secret-of-16-chars"}
    kept = parse_config(data, "serve.yaml").as_written()
    assert kept["http_options"]["dashboard_token"] == BLANKED
    assert {k: v for k, v in kept.items() if k != "http_options"} == {
        k: v for k, v in data.items() if k != "http_options"
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"applications": []}, "applications: List should have at least 1 item"),
        ({}, "applications: required"),
        ({"proxy_location": "Somewhere", **_app()}, "proxy_location: Input should be"),
        ({"http_options": {"port": 70000}, **_app()}, "http_options.port: Input should be less than"),
        ({"http_options": {"proxy_location": "HeadOnly"}, **_app()}, "proxy_location belongs at the top"),
        (_app(colour="red"), r"applications\[0\] \(a\)\.colour: unknown field"),
        (
            _app(import_path="no colon"),
            r'applications\[0\] \(a\)\.import_path: Import string "no colon" must look like '
            r'"module:attribute" or "module.attribute"',
        ),
        (_app(route_prefix="api"), r"applications\[0\] \(a\)\.route_prefix: must start with a forward slash"),
        (
            _app(deployments=[{"name": "D", "max_ongoing_requests": 0}]),
            r"applications\[0\] \(a\)\.deployments\[0\] \(D\)\.max_ongoing_requests: .*greater than",
        ),
        (_app(deployments=[{"num_replicas": 2}]), "each deployment needs its name"),
        (
            _app(deployments=[{"name": "D", "gang_scheduling_config": {"gang_size": 2}}]),
            r"deployments\[0\] \(D\)\.gang_scheduling_config: a Ray Serve option app_toolkit does not",
        ),
        (_app(runtime_env={"working_dir": "."}), "working_dir and py_modules must be URIs"),
        ({"grpc_options": {"grpc_servicer_functions": ["m:f"]}, **_app()}, "grpc_servicer_functions"),
        ({"logging_config": {"encoding": "XML"}, **_app()}, "logging_config.encoding"),
        ({"logging_config": {"log_level": "LOUD"}, **_app()}, "logging_config.log_level: must be DEBUG"),
        (
            {"applications": [_app()["applications"][0], _app(name="b")["applications"][0]]},
            "two applications have the route_prefix '/'",
        ),
        (["not", "a", "mapping"], "expected a mapping"),
    ],
)
def test_errors_name_the_file_and_the_field(data: Any, message: str) -> None:
    with pytest.raises(tk.ConfigError, match=message) as failed:
        parse_config(data, "serve.yaml")
    assert str(failed.value).startswith(("Invalid config serve.yaml", "serve.yaml"))


RAY_SERVE_260_AUTOSCALING = """
# --8<-- [start:ray-serve-autoscaling]
applications:
- name: pipeline
  route_prefix: /
  import_path: tests.apps.config_apps:hello
  autoscaling_policy:
    policy_function: tests.apps.policies:together
  deployments:
  - name: Ingress
    autoscaling_config:
      min_replicas: 1
      max_replicas: 4
      metrics_interval_s: 2
      look_back_period_s: 10
      aggregation_function: MAX
      smoothing_factor: 0.5
      upscale_smoothing_factor: 2
      downscale_smoothing_factor: null
      policy:
        policy_function: tests.apps.policies.scale_on_metric
# --8<-- [end:ray-serve-autoscaling]
"""


def test_a_ray_serve_260_file_with_custom_autoscaling_loads_and_means_the_same() -> None:
    """Ray Serve's autoscaling fields, the deployment's policy in the dotted form and the
    application's policy (its 2.60 schema): each means here what it means there."""
    (app,) = parse_config(yaml.safe_load(RAY_SERVE_260_AUTOSCALING), "serve.yaml").applications
    assert app.autoscaling_policy is not None
    assert app.autoscaling_policy.policy_function == "tests.apps.policies:together"
    config = tk.DeploymentConfig.model_validate(app.deployments[0].options).autoscaling_config
    assert config is not None
    assert (config.metrics_interval_s, config.look_back_period_s, config.aggregation_function) == (
        2,
        10,
        "max",
    )
    assert (config.upscale_factor, config.downscale_factor) == (2, 0.5)  # Ray Serve's fallbacks
    assert config.policy.policy_function == "tests.apps.policies.scale_on_metric"
    assert not config.policy.is_default
    with pytest.raises(tk.ConfigError, match=r"autoscaling_policy\.policy_function: must be a function"):
        parse_config(_app(autoscaling_policy={"policy_function": "nothing"}), "serve.yaml")


def test_building_sends_the_policies_by_value_and_names_a_bad_one() -> None:
    """The application's and the deployment's policies are imported where the app is
    built and handed to the serializer by value (the controller imports nothing of the
    app); a policy that cannot be imported fails the build naming its field."""
    from app_toolkit._runtime.messages import ByValue
    from tests.apps import policies

    sent: list[object] = []

    def serialize(value: object) -> bytes:
        if isinstance(value, ByValue):
            sent.append(value.value)
        return _keep(value)

    (app,) = parse_config(yaml.safe_load(RAY_SERVE_260_AUTOSCALING), "serve.yaml").applications
    spec = build_spec(app, serialize)
    assert sent == [policies.scale_on_metric, policies.together]
    assert spec.autoscaling_policy is not None and spec.autoscaling_policy.serialized
    config = spec.deployment("Ingress").config.autoscaling_config
    assert config is not None and config.policy.serialized
    assert config.policy.name == "tests.apps.policies.scale_on_metric"
    missing = _app(autoscaling_policy={"policy_function": "tests.apps.policies:nowhere"})
    (bad,) = parse_config(missing, "serve.yaml").applications
    with pytest.raises(
        tk.ConfigError, match='autoscaling_policy.policy_function: Module "tests.apps.policies" has no'
    ):
        build_spec(bad, _keep)


#: Import paths as Ray Serve's docs write them too: dotted, no colon (its
#: RequestRouterConfig's docstring names the prefix-aware router so).
DOTTED_PATHS = """
applications:
- name: app1
  route_prefix: /
  import_path: tests.apps.config_apps.build
  deployments:
  - name: Greeter
    request_router_config:
      request_router_class: ray.serve.llm.request_router.PrefixCacheAffinityRouter
  - name: Front
    request_router_config:
      request_router_class: tests.apps.routers.LowestIdRouter
  shadow: {to: app2, compare: tests.unit.test_shadow.same_words}
- name: app2
  route_prefix: /two
  import_path: tests.apps.config_apps.hello
"""


def test_a_file_with_dotted_import_paths_builds_with_our_routers(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(DOTTED_PATHS)
    first, second = load_config(path).applications
    assert (first.import_path, second.import_path) == (
        "tests.apps.config_apps.build",
        "tests.apps.config_apps.hello",
    )
    assert first.shadow is not None and first.shadow.compare == "tests.unit.test_shadow.same_words"
    spec = build_spec(first, _keep)
    greeter = spec.deployment("Greeter").config.request_router_config
    front = spec.deployment("Front").config.request_router_config
    assert greeter is not None and greeter.class_path == PREFIX_AWARE
    assert front is not None and front.class_path == "tests.apps.routers:LowestIdRouter"
    assert build_spec(second, _keep).deployment("Ingress")


def test_build_writes_a_dotted_import_path_as_given() -> None:
    written = describe(["tests.apps.config_apps.hello"])
    (app,) = parse_config(yaml.safe_load(dump_config(written)), "built").applications
    assert (app.name, app.import_path) == ("hello", "tests.apps.config_apps.hello")


def test_unreadable_and_non_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(tk.ConfigError, match="Cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("applications: [\n")
    with pytest.raises(tk.ConfigError, match="not valid YAML"):
        load_config(broken)
    tagged = tmp_path / "tagged.yaml"
    tagged.write_text("applications: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(tk.ConfigError, match="not valid YAML"):  # safe_load: no Python tags
        load_config(tagged)


def _keep(value: object) -> bytes:
    """A serializer for pure tests: keeps nothing, returns stable bytes."""
    return repr(type(value)).encode()


def test_builders_get_args_and_overrides_replace_code_options() -> None:
    config = parse_config(yaml.safe_load(RAY_SERVE_BUILT), "serve.yaml")
    spec = build_spec(config.applications[0], _keep)
    greeter = spec.deployment("Greeter").config
    assert greeter.autoscaling_config is not None  # num_replicas: auto
    assert greeter.user_config == {"punctuation": "."}
    assert greeter.ray_actor_options.num_cpus == 0.5
    # The same entry gives the same version (replicas kept); another args value does not.
    again = build_spec(config.applications[0], _keep)
    assert again.deployment("Greeter").code_version == spec.deployment("Greeter").code_version
    other = parse_config(yaml.safe_load(RAY_SERVE_BUILT.replace("Bonjour", "Hallo")), "s")
    changed = build_spec(other.applications[0], _keep)
    assert changed.deployment("Greeter").code_version != spec.deployment("Greeter").code_version


def test_building_fails_on_unknown_deployments_and_bad_args() -> None:
    unknown = parse_config(
        _app(import_path="tests.apps.config_apps:build", deployments=[{"name": "Nope", "num_replicas": 2}]),
        "s",
    )
    with pytest.raises(tk.ConfigError, match="'Nope' is not a deployment of .* \\(it has: Front, Greeter\\)"):
        build_spec(unknown.applications[0], _keep)
    bad_args = parse_config(_app(import_path="tests.apps.config_apps:build", args={"fail": "maybe"}), "s")
    with pytest.raises(tk.ConfigError, match="Invalid args for builder"):
        build_spec(bad_args.applications[0], _keep)
    not_builder = parse_config(_app(args={"x": 1}), "s")
    with pytest.raises(tk.ConfigError, match="args: .* not a builder function .*, so it takes no arguments"):
        build_spec(not_builder.applications[0], _keep)
    runtime_env = parse_config(_app(runtime_env={"env_vars": {"A": "1"}}), "s")
    greeter = build_spec(runtime_env.applications[0], _keep).deployment("Ingress")
    assert greeter.config.ray_actor_options.runtime_env == {"env_vars": {"A": "1"}}


def test_build_writes_a_file_that_loads_back() -> None:
    written = describe(["examples.demo:app", "tests.apps.config_apps:hello"])
    text = dump_config(written)
    config = parse_config(yaml.safe_load(text), "built")
    assert [(a.name, a.route_prefix) for a in config.applications] == [("demo", "/"), ("hello", "/hello")]
    demo = {d.name: d.options for d in config.applications[0].deployments}
    assert demo["Ingress"] == {"num_replicas": 2}


def test_upgrade_placement_and_capacity_options_round_trip_through_a_file() -> None:
    written = describe(["tests.apps.placement:grouped_app"])
    written["target_capacity"] = 50
    config = parse_config(yaml.safe_load(dump_config(written)), "built")
    assert config.target_capacity == 50
    options = {d.name: d.options for d in config.applications[0].deployments}["Grouped"]
    assert options["placement_group_bundles"] == [{"test_accelerator": 1.0}, {"test_accelerator": 1.0}]
    assert options["placement_group_strategy"] == "PACK"
    assert options["rolling_update_percentage"] == 0.5 and options["max_surge_percent"] == 25
    with pytest.raises(tk.ConfigError, match="target_capacity: Input should be less than or equal to 100"):
        parse_config({**written, "target_capacity": 150}, "s")


def test_every_option_set_in_code_round_trips_through_a_built_file() -> None:
    """Whatever code can set, a file can set: app-toolkit build writes every option of
    every deployment of every module-level test application, and the file means the same."""
    import importlib
    import pkgutil

    import tests.apps
    from app_toolkit.build import _deployments
    from app_toolkit.config import DeploymentConfig

    seen: set[str] = set()
    for module in pkgutil.iter_modules(tests.apps.__path__):
        imported = importlib.import_module(f"tests.apps.{module.name}")
        for attribute, value in vars(imported).items():
            if not isinstance(value, tk.Application):
                continue
            path = f"tests.apps.{module.name}:{attribute}"
            config = parse_config(yaml.safe_load(dump_config(describe([path]))), path)
            in_file = {d.name: d.options for d in config.applications[0].deployments}
            for deployment in _deployments(value):
                assert DeploymentConfig.model_validate(in_file[deployment.name]) == deployment.config, path
                seen |= deployment.config.model_fields_set
    assert seen == set(DeploymentConfig.model_fields)  # tests.apps.config_apps:every_option
