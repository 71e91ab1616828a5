"""``build_openai_app``'s argument: the models of one OpenAI application and its ingress
(Ray Serve LLM's ``LLMServingArgs``), and the one function that reads it from a config
file's ``args``, naming each field at fault by its path."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from app_toolkit.config.api_keys import check_key
from app_toolkit.config.ray_serve_only import drop_refused
from app_toolkit.config.schema import field_errors
from app_toolkit.exceptions import BuilderArgsError
from app_toolkit.llm.config import LLMConfig, LLMDeploymentConfig, Schema, read_yaml
from app_toolkit.llm.refused import RAY_SERVE_LLM_ONLY

#: Ray Serve LLM's default ingress class, as its configs name it: this package's.
DEFAULT_INGRESS = "app_toolkit.llm:OpenAIIngress"


class IngressClsConfig(Schema):
    """Ray Serve LLM's ``ingress_cls_config``: which class serves the OpenAI routes, and what
    more its constructor takes."""

    ingress_cls: str | type = Field(
        DEFAULT_INGRESS,
        description="A subclass of app_toolkit.llm.OpenAIIngress (its own routes, middleware "
        "and overrides: docs/llm.md), or its import path; Ray Serve LLM's OpenAiIngress names this "
        "package's.",
    )
    ingress_extra_kwargs: dict[str, object] = Field(
        default_factory=dict,
        description="Keyword arguments the class's constructor takes besides the models'.",
    )

    @field_validator("ingress_extra_kwargs", mode="before")
    @classmethod
    def _none_is_empty(cls, value: object) -> object:
        return {} if value is None else value


class LLMServingArgs(Schema):
    """An OpenAI application serving several models (``build_openai_app``'s argument)."""

    llm_configs: list[LLMConfig] = Field(
        min_length=1,
        description="The models: LLMConfig objects, dicts of their fields, or paths of YAML "
        "files each holding one.",
    )
    ingress_deployment_config: LLMDeploymentConfig = Field(
        default_factory=LLMDeploymentConfig, description="The OpenAI ingress deployment's options."
    )
    api_key: list[SecretStr] = Field(
        default_factory=list,
        description="vLLM's --api-key: keys (plaintext, as vLLM takes them) that every route of "
        "the app needs as 'Authorization: Bearer <key>' (or X-API-Key); unset: VLLM_API_KEY "
        "where the app is built, if set. http_options.api_keys keeps hashes instead (docs/llm.md).",
    )

    allowed_origins: list[str] = Field(
        default_factory=lambda: ["*"],
        description="vLLM's --allowed-origins: origins a browser may call the app from (CORS); "
        "['*']: any (vLLM's default).",
    )
    allowed_methods: list[str] = Field(
        default_factory=lambda: ["*"], description="vLLM's --allowed-methods (CORS): ['*']: any."
    )
    allowed_headers: list[str] = Field(
        default_factory=lambda: ["*"], description="vLLM's --allowed-headers (CORS): ['*']: any."
    )
    allow_credentials: bool = Field(
        False, description="vLLM's --allow-credentials (CORS): browsers may send cookies with requests."
    )
    ingress_cls_config: IngressClsConfig = Field(
        default_factory=lambda: IngressClsConfig(),
        description="Ray Serve LLM's: the ingress class (a subclass of app_toolkit.llm.OpenAIIngress, "
        "or its import path) and keyword arguments its constructor takes besides the models'.",
    )

    @field_validator("api_key", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("api_key")
    @classmethod
    def _usable(cls, keys: list[SecretStr]) -> list[SecretStr]:
        for key in keys:
            check_key(key.get_secret_value(), "an API key")
        return keys

    @model_validator(mode="before")
    @classmethod
    def _read_files(cls, data: object) -> object:
        data = drop_refused("llm_serving_args", data, RAY_SERVE_LLM_ONLY["llm_serving_args"])
        if not isinstance(data, dict) or not isinstance(data.get("llm_configs"), list):
            return data
        configs: list[object] = []
        problems: dict[str | tuple[str, ...], tuple[object, str]] = {}
        for index, config in enumerate(data["llm_configs"]):
            if not isinstance(config, str | Path):
                configs.append(config)
                continue
            try:
                configs.append(read_yaml(Path(config)))
            except ValueError as exc:
                problems[("llm_configs", str(index))] = (config, str(exc))
        if problems:
            raise field_errors("llm_serving_args", problems)
        return {**data, "llm_configs": configs}

    @model_validator(mode="after")
    def _unique_ids(self) -> LLMServingArgs:
        ids = [config.model_id for config in self.llm_configs]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"two llm_configs have the model_id {twice[0]!r}; each model needs its own")
        names = [config.deployment_name for config in self.llm_configs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"two models would be deployed as {twice[0]!r}; give one a deployment_config.name"
            )
        return self


def serving_args(builder_config: LLMServingArgs | Mapping[str, object]) -> LLMServingArgs:
    """``build_openai_app``'s argument (a config file's ``args``, or the model itself) as
    :class:`LLMServingArgs`; a BuilderArgsError lists each field at fault, by its path."""
    if isinstance(builder_config, LLMServingArgs):
        return builder_config
    if not isinstance(builder_config, Mapping):
        raise BuilderArgsError(
            f"LLMServingArgs must be a mapping with llm_configs, got {type(builder_config).__name__}"
        )
    try:
        return LLMServingArgs.model_validate(dict(builder_config))
    except ValidationError as exc:
        lines = [f"{_where(e['loc'], builder_config)}: {_message(e)}" for e in exc.errors()]
        raise BuilderArgsError("Invalid LLMServingArgs:\n  " + "\n  ".join(lines)) from None


def _where(location: tuple[int | str, ...], data: object) -> str:
    """``llm_configs[1] (model_id 'qwen').engine_kwargs.dtype`` (a file: its path)."""
    parts: list[str] = []
    node = data
    for part in location:
        index = int(part) if isinstance(part, int) or (isinstance(part, str) and part.isdigit()) else None
        if index is not None and parts and isinstance(node, list):
            node = node[index] if index < len(node) else None
            parts[-1] += f"[{index}]"
            if isinstance(node, str | Path):
                parts[-1] += f" (file {str(node)!r})"
                node = _quiet_yaml(Path(node))
            elif isinstance(node, Mapping) and isinstance(node.get("model_loading_config"), Mapping):
                parts[-1] += f" (model_id {node['model_loading_config'].get('model_id')!r})"
            continue
        parts.append(str(part))
        node = node.get(part) if isinstance(node, Mapping) else None
    return ".".join(parts) or "LLMServingArgs"


def _quiet_yaml(path: Path) -> object:
    try:
        return read_yaml(path)
    except ValueError:
        return None


def _message(error: ErrorDetails) -> str:
    if error["type"] == "extra_forbidden":
        return (
            "unknown field (in neither Ray Serve LLM's schema nor app_toolkit's): remove it or "
            "correct its spelling"
        )
    if error["type"] == "missing":
        return "required"
    return str(error["msg"]).removeprefix("Value error, ")
