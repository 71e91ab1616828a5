"""Every field of Ray Serve 2.60's config schema, field group by field group: a file using
the fields this toolkit takes loads and means the same; one using a field it refuses
fails naming the field's path. docs/ray-serve.md's table is checked against both."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

import app_toolkit as tk
from app_toolkit.build import build_spec
from app_toolkit.config import DeploymentConfig
from app_toolkit.config.file import ServeConfigFile, parse_config
from app_toolkit.config.ray_serve_only import RAY_SERVE_ONLY

#: The fields of Ray Serve 2.60's schema classes (ray/serve/schema.py, ray/serve/config.py),
#: by the row of docs/ray-serve.md's table that lists them.
RAY_SERVE_260_FIELDS = {
    "top level": {
        "proxy_location",
        "http_options",
        "grpc_options",
        "controller_options",
        "logging_config",
        "tracing_config",
        "applications",
        "target_capacity",
    },
    "`http_options`": {
        "host",
        "port",
        "root_path",
        "request_timeout_s",
        "keep_alive_timeout_s",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_keyfile_password",
        "ssl_ca_certs",
    },
    "`grpc_options`": {"port", "grpc_servicer_functions", "request_timeout_s", "enable_reflection"},
    "`logging_config`": {
        "encoding",
        "log_level",
        "logs_dir",
        "enable_access_log",
        "additional_log_standard_attrs",
    },
    "application": {
        "name",
        "route_prefix",
        "import_path",
        "runtime_env",
        "host",
        "port",
        "deployments",
        "autoscaling_policy",
        "args",
        "logging_config",
        "external_scaler_enabled",
    },
    "deployment": {
        "name",
        "num_replicas",
        "max_ongoing_requests",
        "max_queued_requests",
        "backpressure_config",
        "user_config",
        "autoscaling_config",
        "graceful_shutdown_wait_loop_s",
        "graceful_shutdown_timeout_s",
        "health_check_period_s",
        "health_check_timeout_s",
        "ray_actor_options",
        "placement_group_bundles",
        "placement_group_strategy",
        "placement_group_bundle_label_selector",
        "max_replicas_per_node",
        "logging_config",
        "request_router_config",
        "gang_scheduling_config",
        "deployment_actors",
        "rolling_update_percentage",
        "max_surge_percent",
    },
    "`autoscaling_config`": {
        "min_replicas",
        "initial_replicas",
        "max_replicas",
        "target_ongoing_requests",
        "metrics_interval_s",
        "look_back_period_s",
        "smoothing_factor",
        "upscale_smoothing_factor",
        "downscale_smoothing_factor",
        "upscaling_factor",
        "downscaling_factor",
        "downscale_delay_s",
        "downscale_to_zero_delay_s",
        "upscale_delay_s",
        "aggregation_function",
        "policy",
    },
    "`policy`, `autoscaling_policy`": {"policy_function", "policy_kwargs"},
    "`ray_actor_options`": {
        "runtime_env",
        "num_cpus",
        "num_gpus",
        "memory",
        "resources",
        "accelerator_type",
        "label_selector",
        "fallback_strategy",
    },
    "`backpressure_config`": {"status_code", "retry_after_s"},
}

#: The table's rows whose refused fields RAY_SERVE_ONLY holds, by its kind.
ROW_KINDS = {
    "top level": "file",
    "`http_options`": "http",
    "`grpc_options`": "grpc",
    "`logging_config`": "logging",
    "application": "application",
    "deployment": "deployment",
    "`ray_actor_options`": "ray_actor_options",
}


def _docs_table() -> dict[str, tuple[set[str], set[str]]]:
    """docs/ray-serve.md's config file table: row -> (fields taken, fields refused)."""
    text = (Path(__file__).parents[2] / "docs" / "ray-serve.md").read_text()
    section = text.split("## Config files", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[set[str], set[str]]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("where", "---"):
            continue

        def names(cell: str) -> set[str]:
            # The field names: backticked words before any parenthesis' explanation.
            plain = re.sub(r"\([^()]*(\([^()]*\)[^()]*)*\)", "", cell)
            return set(re.findall(r"`([a-z_]+)`", plain))

        rows[cells[0]] = (names(cells[1]), names(cells[2]))
    return rows


def test_the_docs_table_lists_every_ray_serve_field_once_as_the_code_treats_it() -> None:
    table = _docs_table()
    assert set(table) == set(RAY_SERVE_260_FIELDS)
    for row, fields in RAY_SERVE_260_FIELDS.items():
        taken, refused = table[row]
        assert taken | refused == fields, row  # every Ray Serve field, nothing else
        assert not taken & refused, row
        if row in ROW_KINDS:
            assert refused == set(RAY_SERVE_ONLY[ROW_KINDS[row]]), row
        else:
            assert not refused, row


def _load(text: str) -> ServeConfigFile:
    return parse_config(yaml.safe_load(text), "serve.yaml")


def _built(text: str) -> dict[str, DeploymentConfig]:
    """Each deployment's config once the file's entries apply to the code's options."""
    (app,) = _load(text).applications
    spec = build_spec(app, lambda value: b"")
    return {name: spec.deployment(name).config for name in ("Front", "Greeter")}


AUTOSCALING = """
applications:
- name: app1
  import_path: tests.apps.config_apps:build
  autoscaling_policy:
    policy_function: tests.apps.policies:together
    policy_kwargs: {}
  deployments:
  - name: Greeter
    num_replicas: null          # what serve build writes beside autoscaling_config
    autoscaling_config:
      min_replicas: 0
      initial_replicas: 2
      max_replicas: 6
      target_ongoing_requests: 3
      metrics_interval_s: 5
      look_back_period_s: 20
      smoothing_factor: 0.9
      upscale_smoothing_factor: 0.8
      downscale_smoothing_factor: 0.7
      upscaling_factor: null
      downscaling_factor: 0.6
      downscale_delay_s: 120
      downscale_to_zero_delay_s: 300
      upscale_delay_s: 4
      aggregation_function: max
      policy:
        policy_function: tests.apps.policies:hold
        policy_kwargs: {}
  - name: Front
    num_replicas: auto
    autoscaling_config:
      max_replicas: 3
"""


def test_autoscaling_fields_mean_what_they_mean_in_ray_serve() -> None:
    configs = _built(AUTOSCALING)
    scaled = configs["Greeter"].autoscaling_config
    assert scaled is not None
    assert (scaled.min_replicas, scaled.start_replicas, scaled.max_replicas) == (0, 2, 6)
    assert (scaled.target_ongoing_requests, scaled.metrics_interval_s, scaled.look_back_period_s) == (
        3,
        5,
        20,
    )
    assert (scaled.upscale_delay_s, scaled.downscale_delay_s, scaled.downscale_to_zero_delay_s) == (
        4,
        120,
        300,
    )
    assert scaled.aggregation_function == "max"
    # Ray Serve's fallbacks: upscaling_factor unset takes upscale_smoothing_factor.
    assert (scaled.upscale_factor, scaled.downscale_factor) == (0.8, 0.6)
    assert scaled.policy.name == "tests.apps.policies:hold"
    # num_replicas: auto with some fields: Ray Serve's auto defaults for the others.
    auto = configs["Front"].autoscaling_config
    assert auto is not None
    assert (auto.min_replicas, auto.max_replicas, auto.target_ongoing_requests) == (1, 3, 2)
    policy = _load(AUTOSCALING).applications[0].autoscaling_policy
    assert policy is not None and policy.name == "tests.apps.policies:together"


BACKPRESSURE = """
applications:
- import_path: tests.apps.config_apps:build
  deployments:
  - name: Greeter
    max_ongoing_requests: 3
    max_queued_requests: 8
    backpressure_config: {status_code: 429, retry_after_s: 2.5}
  - name: Front
    max_queued_requests: -1
    backpressure_config: {retry_after_s: null}
"""


def test_backpressure_fields_mean_what_they_mean_in_ray_serve() -> None:
    configs = _built(BACKPRESSURE)
    greeter, front = configs["Greeter"], configs["Front"]
    assert (greeter.max_ongoing_requests, greeter.max_queued_requests) == (3, 8)
    assert (greeter.backpressure_config.status_code, greeter.backpressure_config.retry_after_s) == (429, 2.5)
    assert front.max_queued_requests == -1
    # retry_after_s: null sends no Retry-After, Ray Serve's default; 503 is its default status.
    assert (front.backpressure_config.status_code, front.backpressure_config.retry_after_s) == (503, None)


UPGRADE = """
applications:
- import_path: tests.apps.config_apps:build
  deployments:
  - name: Greeter
    rolling_update_percentage: 0.25
    max_surge_percent: 50
    graceful_shutdown_wait_loop_s: 0.5
    graceful_shutdown_timeout_s: 7
    health_check_period_s: 3
    health_check_timeout_s: 9
  - name: Front
    max_surge_percent: 0
"""


def test_upgrade_fields_mean_what_they_mean_in_ray_serve() -> None:
    configs = _built(UPGRADE)
    greeter = configs["Greeter"]
    assert (greeter.rolling_update_percentage, greeter.max_surge_percent) == (0.25, 50)
    assert (greeter.graceful_shutdown_wait_loop_s, greeter.graceful_shutdown_timeout_s) == (0.5, 7)
    assert (greeter.health_check_period_s, greeter.health_check_timeout_s) == (3, 9)
    assert configs["Front"].max_surge_percent == 0  # old replicas stop before new ones start


PLACEMENT = """
applications:
- import_path: tests.apps.config_apps:build
  deployments:
  - name: Greeter
    ray_actor_options:
      num_cpus: 1
      num_gpus: 0.5
      memory: 1073741824
      resources: {disk_fast: 1}
      accelerator_type: A100
      runtime_env: {env_vars: {MODE: fast}}
    placement_group_bundles:
    - {CPU: 2, GPU: 0.5, memory: 1073741824, disk_fast: 1, "accelerator_type:A100": 1}
    - {CPU: 1}
    placement_group_strategy: STRICT_PACK
  - name: Front
    max_replicas_per_node: 2
    ray_actor_options: {num_cpus: null, num_gpus: null}
"""


def test_placement_fields_mean_what_they_mean_in_ray_serve() -> None:
    configs = _built(PLACEMENT)
    greeter, front = configs["Greeter"], configs["Front"]
    actor = greeter.ray_actor_options
    assert (actor.num_cpus, actor.num_gpus, actor.memory) == (1, 0.5, 1 << 30)
    # accelerator_type: Ray's 0.001 of the accelerator's resource, beside the others.
    assert actor.resources == {"disk_fast": 1, "accelerator_type:A100": 0.001}
    assert actor.runtime_env == {"env_vars": {"MODE": "fast"}}
    assert greeter.placement_group_strategy == "STRICT_PACK"
    assert greeter.reserved_resources() == {
        "CPU": 3,
        "GPU": 0.5,
        "memory": 1 << 30,
        "disk_fast": 1,
        "accelerator_type:A100": 1,
    }
    assert front.max_replicas_per_node == 2
    # null CPUs and GPUs take the default (0 here: docs/options.md).
    assert (front.ray_actor_options.num_cpus, front.ray_actor_options.num_gpus) == (0, 0)


HTTP = """
proxy_location: HeadOnly
http_options:
  host: 0.0.0.0
  port: 8123
  root_path: /api
  request_timeout_s: 12.5
  keep_alive_timeout_s: 9
grpc_options: {port: 9001, grpc_servicer_functions: [], request_timeout_s: 3, enable_reflection: true}
controller_options: {runtime_env: null}
tracing_config: {enabled: false, sampling_ratio: 0.5}
target_capacity: 40
applications:
- name: hello
  route_prefix: /hello
  import_path: tests.apps.config_apps:hello
"""


def test_http_and_top_level_fields_mean_what_they_mean_in_ray_serve() -> None:
    config = _load(HTTP)
    http = config.http()
    assert (http.host, http.port, http.root_path, http.proxy_location) == (
        "0.0.0.0",
        8123,
        "/api",
        "HeadOnly",
    )
    assert (http.request_timeout_s, http.keep_alive_timeout_s) == (12.5, 9)
    assert config.target_capacity == 40
    (app,) = config.applications
    assert (app.name, app.route_prefix) == ("hello", "/hello")


def _file(top: dict[str, Any] | None = None, **entry: Any) -> dict[str, Any]:
    app = {"name": "a", "import_path": "tests.apps.config_apps:build", **entry}
    return {**(top or {}), "applications": [app]}


def _deployment(**fields: Any) -> dict[str, Any]:
    return _file(deployments=[{"name": "Greeter", **fields}])


#: Each field refused by design: a file using it, the path its error names, and a file
#: with it at its "not used" value, which loads.
REFUSED: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "controller_options",
        _file({"controller_options": {"runtime_env": {"env_vars": {"A": "1"}}}}),
        _file({"controller_options": {}}),
    ),
    ("tracing_config", _file({"tracing_config": {"enabled": True}}), _file({"tracing_config": None})),
    (
        "logging_config.logs_dir",
        _file({"logging_config": {"logs_dir": "/var/log/serve"}}),
        _file({"logging_config": {"logs_dir": None}}),
    ),
    (
        "applications[0] (a).deployments[0] (Greeter).logging_config.additional_log_standard_attrs",
        _deployment(logging_config={"additional_log_standard_attrs": ["lineno"]}),
        _deployment(logging_config={"additional_log_standard_attrs": []}),
    ),
    (
        "grpc_options.grpc_servicer_functions",
        _file({"grpc_options": {"grpc_servicer_functions": ["m:add_servicer"]}}),
        _file({"grpc_options": {"grpc_servicer_functions": []}}),
    ),
    ("applications[0] (a).host", _file(host="0.0.0.0"), _file(host=None)),
    ("applications[0] (a).port", _file(port=8000), _file(port=None)),
    (
        "applications[0] (a).external_scaler_enabled",
        _file(external_scaler_enabled=True),
        _file(external_scaler_enabled=False),
    ),
    *[
        (
            f"applications[0] (a).deployments[0] (Greeter).{name}",
            _deployment(**{name: used}),
            _deployment(**{name: None}),
        )
        for name, used in (
            ("gang_scheduling_config", {"gang_size": 2}),
            ("deployment_actors", [{"name": "tree", "actor_class": "my.actors:Tree"}]),
        )
    ],
    (
        "applications[0] (a).deployments[0] (Greeter).placement_group_bundle_label_selector",
        _deployment(
            placement_group_bundles=[{"CPU": 1}], placement_group_bundle_label_selector=[{"zone": "a"}]
        ),
        _deployment(placement_group_bundles=[{"CPU": 1}], placement_group_bundle_label_selector=[]),
    ),
    *[
        (
            f"applications[0] (a).deployments[0] (Greeter).ray_actor_options.{name}",
            _deployment(ray_actor_options={name: used}),
            _deployment(ray_actor_options={name: None}),
        )
        for name, used in (("label_selector", {"zone": "a"}), ("fallback_strategy", [{"label_selector": {}}]))
    ],
]


@pytest.mark.parametrize(("path", "used", "unused"), REFUSED, ids=[case[0] for case in REFUSED])
def test_a_field_refused_by_design_is_named_with_what_to_do(
    path: str, used: dict[str, Any], unused: dict[str, Any]
) -> None:
    parse_config(unused, "serve.yaml")  # its "not used" value loads
    with pytest.raises(tk.ConfigError) as failed:
        parse_config(used, "serve.yaml")
    assert f"\n  {path}: a Ray Serve option app_toolkit does not implement: " in str(failed.value)


def test_a_files_request_router_config_is_taken_and_a_field_not_implemented_is_named() -> None:
    routing = {
        "request_router_class": "ray.serve.llm.request_router:PrefixCacheAffinityRouter",
        "request_router_kwargs": {"imbalanced_threshold": 3},
        "request_routing_stats_period_s": 2,
        "request_routing_stats_timeout_s": 5,
        "initial_backoff_s": 0.025,  # Ray's default, as serve build writes it
    }
    config = parse_config(_deployment(request_router_config=routing), "serve.yaml")
    options = DeploymentConfig.model_validate(config.applications[0].deployments[0].options)
    routing_config = options.request_router_config
    assert routing_config is not None
    assert routing_config.class_path.endswith("prefix_aware:PrefixCacheAffinityRouter")
    assert (
        routing_config.request_routing_stats_period_s,
        routing_config.request_routing_stats_timeout_s,
    ) == (2, 5)
    with pytest.raises(tk.ConfigError) as failed:
        parse_config(_deployment(request_router_config={"initial_backoff_s": 0.1}), "serve.yaml")
    assert "deployments[0] (Greeter).request_router_config: initial_backoff_s=0.1 is not" in str(failed.value)


def test_every_refused_field_has_a_case() -> None:
    named = {path.rsplit(".", 1)[-1] for path, _, _ in REFUSED}
    table = {field for fields in RAY_SERVE_ONLY.values() for field in fields}
    assert named == table


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (_file({"colour": 1}), "colour"),
        (_file({"http_options": {"middlewares": []}}), "http_options.middlewares"),
        (_file({"grpc_options": {"servicers": []}}), "grpc_options.servicers"),
        (_file(colour=1), "applications[0] (a).colour"),
        (_deployment(colour=1), "applications[0] (a).deployments[0] (Greeter).colour"),
        (
            _deployment(autoscaling_config={"max_replica": 2}),
            "applications[0] (a).deployments[0] (Greeter).autoscaling_config.max_replica",
        ),
        (
            _deployment(autoscaling_config={"policy": {"function": "m:f"}}),
            "applications[0] (a).deployments[0] (Greeter).autoscaling_config.policy.function",
        ),
        (
            _deployment(backpressure_config={"retry_after": 1}),
            "applications[0] (a).deployments[0] (Greeter).backpressure_config.retry_after",
        ),
        (
            _deployment(ray_actor_options={"cpus": 1}),
            "applications[0] (a).deployments[0] (Greeter).ray_actor_options.cpus",
        ),
    ],
)
def test_a_field_in_neither_schema_is_named(data: dict[str, Any], path: str) -> None:
    with pytest.raises(tk.ConfigError) as failed:
        parse_config(data, "serve.yaml")
    assert f"\n  {path}: unknown field (in neither Ray Serve's schema nor app_toolkit's)" in str(failed.value)


def test_a_deployments_runtime_env_needs_uris_as_an_applications_does() -> None:
    local = _deployment(ray_actor_options={"runtime_env": {"working_dir": "."}})
    with pytest.raises(tk.ConfigError, match=r"\(Greeter\)\.ray_actor_options\.runtime_env: working_dir and"):
        parse_config(local, "serve.yaml")
    parse_config(_deployment(ray_actor_options={"runtime_env": {"working_dir": "s3://b/code.zip"}}), "s")


def test_code_refuses_the_same_fields_with_the_same_message() -> None:
    with pytest.raises(
        tk.ConfigError, match="gang_scheduling_config a Ray Serve option app_toolkit does not"
    ):
        tk.deployment(gang_scheduling_config={"gang_size": 2})(type("Model", (), {}))
    with pytest.raises(tk.ConfigError, match="accelerator_type must name an accelerator type"):
        tk.deployment(ray_actor_options={"accelerator_type": ""})(type("Model", (), {}))


EVERY_OPTION = """
applications:
- import_path: tests.apps.config_apps:build
  deployments:
  - name: Greeter
    num_replicas: 3
    max_ongoing_requests: 4
    max_queued_requests: 5
    backpressure_config: {status_code: 429, retry_after_s: 6}
    user_config: {punctuation: "?"}
    graceful_shutdown_wait_loop_s: 0.5
    graceful_shutdown_timeout_s: 7
    health_check_period_s: 8
    health_check_timeout_s: 9
    health_check_failure_threshold: 2
    ray_actor_options: {num_cpus: 0.25, resources: {disk_fast: 1}}
    max_replicas_per_node: 2
    rolling_update_percentage: 0.5
    max_surge_percent: 20
    surge_timeout_s: 11
    continuation_wait_s: 90
    affinity: prefer
    logging_config: {encoding: JSON, log_level: WARNING, enable_access_log: false}
  - name: Front
    autoscaling_config: {min_replicas: 1, max_replicas: 2}
    placement_group_bundles: [{CPU: 1}]
    placement_group_strategy: SPREAD
    direct_ingress: false
    request_router_config:
      request_router_class: ray.serve.llm.request_router:PrefixCacheAffinityRouter
      request_router_kwargs: {imbalanced_threshold: 4}
"""


def test_a_file_setting_every_deployment_option_the_docs_list_loads() -> None:
    """Every deployment option docs/ray-serve.md says a file takes (and the toolkit's
    own), each set away from its default in one file, means the same once built."""
    entries = {
        entry["name"]: entry for entry in yaml.safe_load(EVERY_OPTION)["applications"][0]["deployments"]
    }
    in_file = {key for entry in entries.values() for key in entry} - {"name"}
    taken, _ = _docs_table()["deployment"]
    assert taken - {"name"} <= in_file
    assert in_file == set(DeploymentConfig.model_fields)
    configs = _built(EVERY_OPTION)
    defaults = DeploymentConfig()
    for name, entry in entries.items():
        for option, value in entry.items():
            if option == "name":
                continue
            got = getattr(configs[name], option)
            if isinstance(got, BaseModel):  # a nested schema: the file's value, validated alike
                value = type(got).model_validate(value)
            assert got == value, (name, option)
            assert got != getattr(defaults, option), (name, option)  # set away from its default
