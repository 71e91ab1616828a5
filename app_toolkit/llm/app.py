"""Ray Serve LLM's builders: ``build_llm_deployment`` (one model's deployment) and
``build_openai_app`` (every model behind one OpenAI-compatible ingress)."""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import app_toolkit as tk
from app_toolkit.config import DeploymentConfig
from app_toolkit.config.api_keys import check_key, key_hash
from app_toolkit.config.request_router import PREFIX_AWARE
from app_toolkit.exceptions import BuilderArgsError
from app_toolkit.import_path import import_attr
from app_toolkit.llm.config import LLMConfig, LLMEngine
from app_toolkit.llm.openai.ingress_app import ingress_class
from app_toolkit.llm.placement import with_replica
from app_toolkit.llm.replica.server import LLMServer
from app_toolkit.llm.serving_args import LLMServingArgs, serving_args

logger = logging.getLogger("app_toolkit.llm")

#: vLLM's environment variable with its server's API key (``--api-key`` wins over it).
API_KEY_ENV = "VLLM_API_KEY"
#: Replies admitted per model replica beyond its engine slots, as a share of them, unless
#: deployment_config says (Ray Serve LLM admits 1e9): a quarter (at least one), so that
#: the engine has the next reply at hand when a slot frees, as vLLM's own queue has it
#: (measured against `vllm serve`: docs/benchmarks.md); the rest wait in the caller's
#: queue, where any replica that frees a slot or starts takes them.
RESERVE_PER_SLOT = 0.25
#: Admitted by a replica whose engine has no slot limit (the echo engine).
ONGOING_WITHOUT_SLOTS = 64
#: Requests an embedding model's replica computes at once (each in a worker thread).
EMBEDDING_ONGOING = 8
#: CPUs a model's replica reserves unless deployment_config.ray_actor_options says.
MODEL_CPUS = 1
#: The ingress's admission (Ray Serve LLM's ingress takes 1e9): it only relays.
INGRESS_ONGOING = 1_000
#: How long a reply whose model replica was lost waits for another to take it (with one
#: replica: its replacement), unless deployment_config.continuation_wait_s says: a few
#: times a replica's replacement, measured on a 2-core host (docs/llm.md, "Replies that
#: outlive their replica"): SmolLM2 on vLLM about 40 s (a large model on GPUs takes
#: minutes), on the transformers engine 41-52 s under the soak's load, the echo engine
#: 5-8 s; embeddings (not measured) as transformers.
CONTINUATION_WAIT_S: Mapping[LLMEngine, float] = {
    "vLLM": 300.0,
    "transformers": 120.0,
    "echo": 60.0,
    "embeddings": 120.0,
}
#: Seconds between a model replica's routing stats (its engine's load, read by the
#: prefix-aware router) where the toolkit picks the router; Ray's default is 10. A busy
#: replica's stats change at every sample, and each change is one load report and one
#: table update per caller of the model (its ingress replicas): docs/llm.md#routing.
ROUTING_STATS_PERIOD_S = 2.0


def build_llm_deployment(
    llm_config: LLMConfig | Mapping[str, object],
    *,
    name_prefix: str | None = None,
    bind_kwargs: Mapping[str, object] | None = None,
    override_serve_options: Mapping[str, object] | None = None,
    deployment_cls: type[LLMServer] | None = None,
) -> tk.Application:
    """One model's deployment, ready to bind into an application or run alone (reached
    through a handle: ``generate``, ``embed``, ``tokenize``, ``detokenize``).

    ``name_prefix`` replaces the name's ``LLMServer-`` prefix; ``override_serve_options``
    win over ``deployment_config``; ``deployment_cls`` is a subclass of :class:`LLMServer`.
    A model that may run on more than one replica routes by prompt prefix
    (``PrefixCacheAffinityRouter``) unless ``request_router_config`` says otherwise.
    """
    config = llm_config if isinstance(llm_config, LLMConfig) else LLMConfig.model_validate(dict(llm_config))
    name = config.deployment_name
    if name_prefix is not None and config.deployment_config.name is None:
        name = name_prefix + name.removeprefix("LLMServer-")
    # deployment()'s keyword arguments (DeploymentConfig's fields, dumped); ray_actor_options is read below.
    options: dict[str, Any] = {
        "max_ongoing_requests": _ongoing(config),
        "continuation_wait_s": CONTINUATION_WAIT_S[config.llm_engine],
        **config.deployment_options(),
    }
    if config.engine_name != "echo":  # a model computes on the CPU it reserves (torch: one thread per CPU)
        options["ray_actor_options"] = {"num_cpus": MODEL_CPUS, **(options.get("ray_actor_options") or {})}
    bundles = config.placement_bundles()
    if bundles and "placement_group_bundles" not in (override_serve_options or {}):
        # One bundle per device of the engine; the replica runs in the first (placement.py).
        options["placement_group_bundles"] = with_replica(bundles, options["ray_actor_options"])
        options["placement_group_strategy"] = config.placement_strategy()
    options.update(override_serve_options or {})
    if "request_router_config" not in options and _most_replicas(options) > 1:
        # Replies that share a prompt prefix go where its keys and values are cached.
        options["request_router_config"] = {
            "request_router_class": PREFIX_AWARE,
            "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S,
        }
    target = deployment_cls or LLMServer
    if not (isinstance(target, type) and issubclass(target, LLMServer)):
        raise TypeError(f"deployment_cls must be a subclass of LLMServer, got {target!r}")
    return tk.deployment(name=name, **options)(target).bind(config, **dict(bind_kwargs or {}))


def build_openai_app(llm_serving_args: LLMServingArgs | Mapping[str, object]) -> tk.Application:
    """An OpenAI-compatible application: every model of ``llm_serving_args`` in its own
    deployment, behind one ingress (``/v1/models``, ``/v1/chat/completions``,
    ``/v1/completions``, ``/v1/responses``, ``/v1/embeddings``, ``/tokenize``, ``/detokenize``).

    ``llm_serving_args`` is :class:`LLMServingArgs` or a dict of its fields (a config
    file's ``args``: ``import_path: app_toolkit.llm:build_openai_app``, or Ray Serve's
    ``ray.serve.llm:build_openai_app``, which names this one).
    """
    args = serving_args(llm_serving_args)
    models = {config.model_id: build_llm_deployment(config) for config in args.llm_configs}
    kinds = {
        config.model_id: "embed" if config.engine_name == "embeddings" else "generate"
        for config in args.llm_configs
    }
    options = {"max_ongoing_requests": INGRESS_ONGOING, **args.ingress_deployment_config.options()}
    name = args.ingress_deployment_config.name or "OpenAiIngress"
    lora = tuple(config.model_id for config in args.llm_configs if config.lora_config is not None)
    hashes = tuple(key_hash(key) for key in _api_keys(args))  # what the ingress's arguments hold
    config = args.ingress_cls_config
    base = import_attr(config.ingress_cls) if isinstance(config.ingress_cls, str) else config.ingress_cls
    served = ingress_class(base, args, keyed=bool(hashes))
    try:  # a constructor that cannot take them fails here, not in every replica
        inspect.signature(served).bind(models, kinds, lora, hashes, **config.ingress_extra_kwargs)
    except TypeError as exc:
        raise BuilderArgsError(
            f"ingress_cls_config.ingress_extra_kwargs do not fit {served.__name__}'s constructor: {exc}"
        ) from None
    return tk.deployment(name=name, **options)(served).bind(
        models, kinds, lora, hashes, **config.ingress_extra_kwargs
    )


def _api_keys(args: LLMServingArgs) -> list[str]:
    """The app's API keys: ``api_key``'s, else ``VLLM_API_KEY``'s here (vLLM's order);
    where they came from is logged (a rebuild without them serves the app open)."""
    if args.api_key:
        logger.info("The OpenAI app needs one of %d API keys (LLMServingArgs.api_key)", len(args.api_key))
        return [key.get_secret_value() for key in args.api_key]
    key = os.environ.get(API_KEY_ENV, "")
    if not key:
        return []
    try:
        check_key(key, API_KEY_ENV)
    except ValueError as exc:
        raise BuilderArgsError(str(exc)) from None
    logger.info("The OpenAI app needs the API key of %s", API_KEY_ENV)
    return [key]


def _most_replicas(options: Mapping[str, object]) -> int:
    """The most replicas a deployment with ``options`` runs."""
    config = DeploymentConfig.model_validate(options)
    autoscaling = config.autoscaling_config
    return autoscaling.max_replicas if autoscaling is not None else config.num_replicas


def _ongoing(config: LLMConfig) -> int:
    if config.engine_name == "embeddings":
        return EMBEDDING_ONGOING
    slots = config.engine_options().slots if config.engine_name == "transformers" else 0
    return admitted(slots) if slots else ONGOING_WITHOUT_SLOTS


def admitted(slots: int) -> int:
    """A model replica's default admission for an engine of ``slots`` slots: the slots,
    and a reserve of :data:`RESERVE_PER_SLOT` of them (at least one) waiting inside."""
    return slots + max(1, math.ceil(slots * RESERVE_PER_SLOT))
