"""Ray Serve LLM's configuration, with 2.60's field names and meanings.

:class:`LLMConfig` configures one model (``serving_args.py``: an OpenAI application of
several). Every field of Ray Serve LLM's classes is either taken, meaning what it means
there unless its description says otherwise, or refused by name with what to do instead
(``refused.py``); docs/llm.md has the table. Nothing here
loads a model or imports a model library: ``model_source`` is resolved where the model
loads (``model_source.py``), and :meth:`LLMConfig.model_files` checks it early.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, field_validator, model_validator

from app_toolkit.config import DeploymentConfig
from app_toolkit.config.ray_serve_only import drop_refused
from app_toolkit.config.schema import NAME_RE, Strict, field_errors
from app_toolkit.llm import vllm_arguments
from app_toolkit.llm.engine_options import EngineKwargs, EngineName, EngineOptions
from app_toolkit.llm.model_source import ModelFiles, cloud_problem, is_cloud_uri, resolve_model_source
from app_toolkit.llm.placement import PlacementGroupConfig, default_strategy, engine_bundles
from app_toolkit.llm.refused import RAY_SERVE_LLM_ONLY, refuse_unknown


class Schema(Strict):
    """A Ray Serve LLM schema: strict, frozen; Ray's field names."""

    # Ray's names start with "model_" (model_loading_config, model_id, model_source).
    model_config = ConfigDict(protected_namespaces=())


class ModelLoadingConfig(Schema):
    """Which model, and what clients call it."""

    model_id: str = Field(
        min_length=1,
        description="The name clients use: requests' model, and its id in /v1/models.",
    )
    model_source: str | None = Field(
        None,
        description="Where the weights are: a local folder or .gguf file, an installed "
        "package carrying weights, or a Hugging Face id in the local cache; null: model_id "
        "is that id (docs/llm.md). Cloud storage is refused: copy it to a local folder.",
    )
    tokenizer_source: str | None = Field(
        None,
        description="Where the tokenizer is, in the same forms as model_source; null: the "
        "model's own (a .gguf file carries one).",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_mirror(cls, data: object) -> object:
        if isinstance(data, Mapping) and isinstance(data.get("model_source"), Mapping):
            problem = (
                "a cloud mirror (CloudMirrorConfig) is not downloaded by app_toolkit; copy the "
                "bucket to a local folder on every node that runs the model (e.g. aws s3 sync) "
                "and give that folder's path as model_source"
            )
            raise field_errors("model_loading_config", {"model_source": (data["model_source"], problem)})
        return data

    @field_validator("model_source", "tokenizer_source")
    @classmethod
    def _local(cls, value: str | None) -> str | None:
        if value is not None and is_cloud_uri(value):
            raise ValueError(cloud_problem(value))
        return value

    @property
    def source(self) -> str:
        """The weights' source: model_source, else model_id (a Hugging Face id then)."""
        return self.model_source or self.model_id


class LoraConfig(Schema):
    """LoRA adapters of a model, read from a local folder and applied by the engine (vLLM's
    LoRA, or peft on the transformers engine); clients name them "model_id:adapter"
    (docs/llm.md, "LoRA adapters")."""

    dynamic_lora_loading_path: str | None = Field(
        None,
        description="The folder holding one folder of adapter files per adapter (its name is "
        "the adapter's id, requested as model 'base_model_id:adapter'); a local path present on "
        "every node that runs the model. Cloud storage is refused: copy it here.",
    )
    max_num_adapters_per_replica: int = Field(
        16, ge=1, description="Most adapters one replica keeps loaded; the least recently used goes."
    )
    download_timeout_s: float | None = Field(
        30.0,
        ge=0,
        description="Taken for Ray's configs, with no effect: adapters are read from a local "
        "folder, so nothing downloads.",
    )
    max_download_tries: int = Field(
        3, ge=0, description="Taken for Ray's configs, with no effect (nothing downloads)."
    )

    @field_validator("dynamic_lora_loading_path")
    @classmethod
    def _local(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if is_cloud_uri(value):
            raise ValueError(cloud_problem(value))
        return value.rstrip("/") or "/"


class ExperimentalConfigs(Schema):
    """``LLMConfig.experimental_configs``: the experimental keys taken."""

    stream_batching_interval_ms: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="After a stream's first token (always sent at once), gather the tokens "
        "of this many milliseconds into one chunk; 0: each token is sent as it comes "
        "(Ray Serve LLM's default is 50, which delays the first token too).",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: object) -> object:
        data = drop_refused("experimental_configs", data, RAY_SERVE_LLM_ONLY["experimental_configs"])
        message = (
            "an experimental key app_toolkit does not take; remove it (it takes "
            f"{', '.join(sorted(cls.model_fields))})"
        )
        return refuse_unknown("experimental_configs", data, cls.model_fields, message)


class LLMDeploymentConfig(DeploymentConfig):
    """A model's (or the ingress's) deployment options: this toolkit's deployment options
    (docs/options.md), and the deployment's ``name``."""

    name: str | None = Field(
        None, description="The deployment's name; null: LLMServer- and the model_id (ingress: OpenAiIngress)."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not NAME_RE.fullmatch(value):
            raise ValueError(f"must use only letters, digits, '_', '.' and '-', got {value!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_bundles(cls, data: object) -> object:
        if isinstance(data, Mapping):
            given = {
                key: data[key]
                for key in ("placement_group_bundles", "placement_group_strategy")
                if data.get(key) is not None
            }
            if given:
                problem = (
                    "a model's placement group comes from its LLMConfig (Ray Serve LLM refuses it here "
                    "too); remove it and set placement_group_config in the LLMConfig"
                )
                raise field_errors(
                    "deployment_config", {key: (value, problem) for key, value in given.items()}
                )
        return data

    def options(self) -> dict[str, Any]:
        """The options as set, less the name: what ``deployment(name=..., **options)`` takes."""
        return self.model_dump(exclude_unset=True, exclude={"name"})


#: The engines ``llm_engine`` names.
LLMEngine = Literal["vLLM", "transformers", "echo", "embeddings"]


class LLMConfig(Schema):
    """One model: where its weights are, its engine and its deployment (Ray Serve LLM's
    ``LLMConfig``)."""

    model_loading_config: ModelLoadingConfig = Field(description="The model, and its name for clients.")
    llm_engine: LLMEngine = Field(
        "vLLM",
        description='The engine: "vLLM" (Ray\'s only value) runs vLLM where the replica has it '
        'installed, else transformers (or embeddings with engine_kwargs.runner "pooling"); '
        '"transformers" the CPU engine; "echo" repeats the prompt (no model).',
    )
    engine_kwargs: EngineKwargs = Field(
        default_factory=EngineKwargs, description="vLLM's engine arguments that mean the same here."
    )
    accelerator_type: str | None = Field(
        None,
        description="Run on nodes with this accelerator: the replica asks for Ray's resource "
        '"accelerator_type:<type>" (as ray_actor_options.accelerator_type does).',
    )
    placement_group_config: PlacementGroupConfig | None = Field(
        None,
        description="The placement group of each replica: its bundles (or one per device, "
        "bundle_per_worker) and strategy, as Ray Serve LLM takes it; null: one bundle per device "
        'of the engine (docs/llm.md, "Placement").',
    )
    lora_config: LoraConfig | None = Field(None, description="LoRA adapters, from a local folder.")
    deployment_config: LLMDeploymentConfig = Field(
        default_factory=LLMDeploymentConfig, description="The model deployment's options."
    )
    runtime_env: dict[str, object] | None = Field(
        None,
        description="The model replica's runtime_env, over deployment_config.ray_actor_options.runtime_env.",
    )
    experimental_configs: ExperimentalConfigs = Field(
        default_factory=ExperimentalConfigs, description="stream_batching_interval_ms."
    )

    @model_validator(mode="before")
    @classmethod
    def _fold(cls, data: object) -> object:
        """Refused fields out; accelerator_type and runtime_env into the replica's actor
        options, where the deployment options' one rule for each applies."""
        data = drop_refused("llm_config", data, RAY_SERVE_LLM_ONLY["llm_config"])
        if not isinstance(data, dict):
            return data
        deployment = data.get("deployment_config")
        if isinstance(deployment, DeploymentConfig):  # code may pass the options' own model
            data["deployment_config"] = deployment = deployment.model_dump(exclude_unset=True)
        accelerator, runtime_env = data.get("accelerator_type"), data.get("runtime_env")
        if (accelerator is None and not runtime_env) or not isinstance(deployment, Mapping | None):
            return data  # nothing to fold, or a wrong type the schema names
        deployment = deployment or {}
        actor = deployment.get("ray_actor_options") or {}
        if not isinstance(actor, Mapping):
            return data
        actor = dict(actor)
        if accelerator is not None:
            if accelerator == "A10":
                accelerator = data["accelerator_type"] = "A10G"  # Ray's rename
            other = actor.get("accelerator_type")
            if other is not None and other != accelerator:
                problem = (
                    f"deployment_config.ray_actor_options.accelerator_type is {other!r}: set one of the two"
                )
                raise field_errors("llm_config", {"accelerator_type": (accelerator, problem)})
            actor["accelerator_type"] = accelerator
        own = actor.get("runtime_env") or {}
        if isinstance(runtime_env, Mapping) and runtime_env and isinstance(own, Mapping):
            actor["runtime_env"] = {**own, **runtime_env}
        return {**data, "deployment_config": {**deployment, "ray_actor_options": actor}}

    @model_validator(mode="after")
    def _adapters_need_a_model(self) -> LLMConfig:
        if self.lora_config is not None and self.engine_name != "transformers":
            raise ValueError(
                f"lora_config needs a generative model (the vLLM or transformers engine); llm_engine "
                f"{self.llm_engine!r} runs {self.engine_name}: remove lora_config"
            )
        return self

    @model_validator(mode="after")
    def _vllm_arguments_need_vllm(self) -> LLMConfig:
        given = vllm_arguments.only_vllm(self.engine_kwargs.vllm_arguments)
        if given and self.llm_engine != "vLLM":
            raise ValueError(
                f"engine_kwargs {', '.join(given)}: vLLM's own engine arguments, which llm_engine "
                f"{self.llm_engine!r} does not take; set llm_engine to vLLM (with vllm installed "
                "where the model runs) or remove them"
            )
        return self

    @model_validator(mode="after")
    def _parsers_read_replies(self) -> LLMConfig:
        given = self.engine_kwargs.parsers
        if given and self.engine_name not in ("transformers", "vllm"):
            raise ValueError(
                f"engine_kwargs {', '.join(given)}: vLLM's parsers read a generative model's replies, "
                f"which llm_engine {self.llm_engine!r} ({self.engine_name}) does not write; remove them"
            )
        return self

    @model_validator(mode="after")
    def _executor_fits_placement(self) -> LLMConfig:
        given = self.engine_kwargs.vllm_arguments.get("distributed_executor_backend")
        wanted = self.executor_backend
        if given is not None and wanted is not None and given != wanted:
            where = (
                "on accelerators, in the replica's placement group"
                if wanted == "ray"
                else ("on a CPU, as processes of the replica")
            )
            raise ValueError(
                f"engine_kwargs.distributed_executor_backend {given!r}: vLLM's workers run {where} "
                f"(as Ray Serve LLM places them); set {wanted!r} or remove it"
            )
        return self

    @model_validator(mode="after")
    def _engine_agrees(self) -> LLMConfig:
        if self.engine_kwargs.embeds and self.llm_engine not in ("vLLM", "embeddings"):
            raise ValueError(
                f"engine_kwargs asks for an embedding model but llm_engine is "
                f"{self.llm_engine!r}; set llm_engine to embeddings (or vLLM)"
            )
        return self

    @classmethod
    def from_file(cls, path: str | Path) -> LLMConfig:
        """The config in the YAML file ``path`` (Ray Serve LLM's ``LLMConfig.from_file``)."""
        return cls.model_validate(read_yaml(Path(path)))

    @property
    def model_id(self) -> str:
        """The name clients use."""
        return self.model_loading_config.model_id

    @property
    def engine_name(self) -> EngineName:
        """The engine to run (``app_toolkit.llm.engines``' name for it)."""
        if self.llm_engine == "vLLM":
            return "embeddings" if self.engine_kwargs.embeds else "transformers"
        return self.llm_engine

    @property
    def devices(self) -> int:
        """The devices one replica's engine runs on: vLLM's tensor_parallel_size ×
        pipeline_parallel_size (1 unless engine_kwargs sets them)."""
        arguments = self.engine_kwargs.vllm_arguments  # whole numbers >= 1 (engine_options.py)
        return int(arguments.get("tensor_parallel_size", 1)) * int(arguments.get("pipeline_parallel_size", 1))

    def placement_bundles(self) -> list[dict[str, float]]:
        """The engine's bundles per replica, before the replica's own resources join the
        first (``placement.py``); empty: no placement group. Only ``llm_engine: vLLM`` runs
        on devices: the engines named otherwise compute on the replica's CPU."""
        if self.llm_engine != "vLLM":
            return []
        return engine_bundles(self.devices, self.accelerator_type, self.placement_group_config)

    @property
    def executor_backend(self) -> str | None:
        """Where vLLM's workers run, as the bundles place them: Ray actors in the replica's
        placement group on accelerators (Ray Serve LLM's choice), processes of the replica
        on a CPU of several devices (``mp``, the bundles STRICT_PACK); None: vLLM's own
        choice (one device on a CPU)."""
        if self.accelerator_type is not None:
            return "ray"
        return "mp" if self.devices > 1 else None

    def placement_strategy(self) -> str:
        """The strategy of :meth:`placement_bundles`: ``placement_group_config``'s, else
        ``placement.default_strategy``."""
        if self.placement_group_config is not None:
            return self.placement_group_config.strategy
        return default_strategy(self.devices, self.accelerator_type)

    @property
    def needs_vllm(self) -> bool:
        """Only vLLM can serve this model: engine_kwargs sets vLLM's own arguments to
        something only vLLM does (``vllm_arguments.NEUTRAL`` aside) or names vLLM's parsers,
        or the replica asks for an accelerator (the transformers engine computes on the
        CPU)."""
        own = vllm_arguments.only_vllm(self.engine_kwargs.vllm_arguments)
        wanted = bool(own) or bool(self.engine_kwargs.parsers) or self.accelerator_type is not None
        return self.llm_engine == "vLLM" and wanted

    def engine_options(self) -> EngineOptions:
        """What the engine is built with (``engine_kwargs``, in the engine's terms)."""
        return self.engine_kwargs.options()

    @property
    def deployment_name(self) -> str:
        """The model deployment's name: deployment_config.name, else ``LLMServer-`` and
        the model id made a deployment name, as Ray Serve LLM makes it ("/" -> "--")."""
        if self.deployment_config.name is not None:
            return self.deployment_config.name
        name = self.model_id.replace("/", "--").replace(".", "_")
        return "LLMServer-" + "".join(c if NAME_RE.fullmatch(c) else "_" for c in name)

    def deployment_options(self) -> dict[str, Any]:
        """The model deployment's options as set (accelerator_type and runtime_env folded in)."""
        return self.deployment_config.options()

    def model_files(self, hf_cache: Path | None = None) -> ModelFiles:
        """The model's files on this machine; ConfigError naming the fix if it has none."""
        return resolve_model_source(self.model_loading_config.source, hf_cache)

    def tokenizer_files(self, hf_cache: Path | None = None) -> ModelFiles | None:
        """The tokenizer's files when tokenizer_source names its own; None: the model's."""
        source = self.model_loading_config.tokenizer_source
        return None if source is None else resolve_model_source(source, hf_cache)


def read_yaml(path: Path) -> object:
    """The data of the YAML file ``path``; ValueError naming it when it cannot be read."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read the LLMConfig file {str(path)!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"the LLMConfig file {str(path)!r} is not valid YAML: {exc}") from None
