"""The public surface is exactly what __all__ says, sorted, and every name exists."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import app_toolkit as tk

EXPECTED = [
    "APIKeyRefused",
    "App",
    "AppToolkitError",
    "Application",
    "ApplicationStatus",
    "ApplicationStatusInfo",
    "AutoscalingConfig",
    "AutoscalingContext",
    "AutoscalingPolicy",
    "AutoscalingStatusInfo",
    "BackPressureError",
    "BackpressureConfig",
    "BatchConfig",
    "ChatCompletionStream",
    "ConfigError",
    "ContinuationRefused",
    "DefinitionError",
    "Depends",
    "DeployError",
    "Deployment",
    "DeploymentBroadcastResponse",
    "DeploymentCallError",
    "DeploymentConfig",
    "DeploymentHandle",
    "DeploymentResponse",
    "DeploymentResponseGenerator",
    "DeploymentStatus",
    "DeploymentStatusInfo",
    "EventInfo",
    "EventLog",
    "EventStream",
    "HTTPOptions",
    "LoggedEvent",
    "LoggingConfig",
    "MemoryEventLog",
    "MethodNotFoundError",
    "OpenAIErrorEvent",
    "ProxyStatus",
    "RayActorOptions",
    "RayServeException",
    "RedisEventLog",
    "ReplicaContext",
    "ReplicaRank",
    "ReplicaState",
    "ReplicaStatusInfo",
    "ReplicaUnavailableError",
    "RequestLostError",
    "RequestTimeoutError",
    "RolloutStatusInfo",
    "RunTarget",
    "ServeStatus",
    "ShadowStatusInfo",
    "StreamAbandoned",
    "UnknownStream",
    "UpgradeStatusInfo",
    "WriterReplaced",
    "admit_key",
    "api_key_name",
    "batch",
    "charge_tokens",
    "continuable",
    "count_request",
    "deadline",
    "delete",
    "deployment",
    "get_app_handle",
    "get_deployment_handle",
    "get_multiplexed_model_id",
    "get_replica_context",
    "get_request_id",
    "get_request_priority",
    "ingress",
    "meters_tokens",
    "multiplexed",
    "open_route",
    "replicated",
    "rollout",
    "run",
    "run_many",
    "set_traffic",
    "shadow",
    "shutdown",
    "start",
    "status",
    "testing",
]


def test_all_is_sorted_and_complete() -> None:
    assert tk.__all__ == sorted(tk.__all__, key=lambda name: (name[0].islower(), name))
    assert tk.__all__ == EXPECTED
    for name in tk.__all__:
        assert getattr(tk, name) is not None
    public = {name for name in vars(tk) if not name.startswith("_")}
    assert public - set(tk.__all__) <= {
        "api",
        "autoscaling_policy",
        "batching",
        "config",
        "deployment",
        "metrics",
        "streaming",
        "event_log",
        "event_log_redis",
        "exceptions",
        "handle",
        "responses",
        "ingress",
        "status",
        "dependencies",
        "import_path",
        "_runtime",
        "context",
        "routes",
        "route_table",
        "cli",
        "traffic",
        "templates",
        "build",
        "app_builder",
        "multiplex",
        "tracing",
        "code_sources",
        "llm",  # app_toolkit.llm: imported by its users, not by app_toolkit
        "request_router",  # routers' interface: what request_router_config names
        "replica_id",  # ReplicaID: what get_replica_context().replica_id is
        "deployment_id",  # DeploymentID: a ReplicaID's and a custom policy's deployment
    }


#: Ray Serve 2.60's parameters of serve.run and serve.run_many (ray/serve/api.py), in its
#: order, positional or keyword, less its ``controller_options``.
RAY_SERVE_RUN = {
    "run": [
        "target",
        "blocking",
        "name",
        "route_prefix",
        "logging_config",
        "_local_testing_mode",
        "external_scaler_enabled",
    ],
    "run_many": [
        "targets",
        "blocking",
        "wait_for_ingress_deployment_creation",
        "wait_for_applications_running",
        "_local_testing_mode",
    ],
}


def test_run_and_run_many_take_ray_serves_parameters_in_its_order() -> None:
    # A Ray Serve program may pass them by position; the toolkit's own come after them,
    # keyword-only (``backend``, ``autoscaling_policy``).
    for name, ray_parameters in RAY_SERVE_RUN.items():
        parameters = list(inspect.signature(getattr(tk, name)).parameters.values())
        head, rest = parameters[: len(ray_parameters)], parameters[len(ray_parameters) :]
        assert [(p.name, p.kind) for p in head] == [
            (n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ray_parameters
        ]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in rest)
        assert "backend" in {p.name for p in rest}


#: app_toolkit.llm's names: Ray Serve LLM's (ray.serve.llm) and EngineOptions, then what a
#: service of one's own builds on (the chat template's projects): engines, text, errors,
#: OpenAI's shapes.
EXPECTED_LLM = [
    "ANSWERED",
    "Adapters",
    "CHAT_RULES",
    "Capabilities",
    "Constraint",
    "DecoderHooks",
    "Delta",
    "DeltaStream",
    "Detokenizer",
    "EchoEngine",
    "EmbeddingEngine",
    "EngineFailed",
    "EngineLoad",
    "EngineOptions",
    "EngineRequest",
    "EngineStopped",
    "LLMConfig",
    "LLMServer",
    "LLMServingArgs",
    "Logprobs",
    "LoraConfig",
    "ModelLoadingConfig",
    "OpenAIError",
    "OpenAIIngress",
    "OptionRules",
    "ResponsesReply",
    "ResponsesRequest",
    "Sampling",
    "StopFilter",
    "StreamOptions",
    "TextEngine",
    "Token",
    "TransformersEngine",
    "Usage",
    "as_openai_error",
    "bad_parameter",
    "build_llm_deployment",
    "build_openai_app",
    "chat_completion",
    "chat_stream",
    "checked_options",
    "install_error_handlers",
    "invalid_request",
    "open_reply",
    "read_whole",
    "responses_events",
    "responses_generation",
    "responses_stream",
    "role_of",
    "stream_error",
    "text_content",
    "unknown_model",
    "usage",
]


def test_the_llm_module_has_a_sorted_surface_and_imports_no_model_library() -> None:
    import app_toolkit.llm as llm

    assert llm.__all__ == sorted(llm.__all__, key=lambda name: (name[0].islower(), name))
    assert llm.__all__ == EXPECTED_LLM
    code = (
        "import sys, app_toolkit.llm; "
        "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    # Every name exists (the two that import torch, on first use).
    assert all(getattr(llm, name) is not None for name in llm.__all__)
    with pytest.raises(AttributeError, match="no attribute 'TransformerEngine'"):
        llm.TransformerEngine  # noqa: B018


def test_the_chat_template_imports_only_published_llm_names() -> None:
    """A project made from the template survives the toolkit's renames: it reads
    ``app_toolkit.llm``'s published names, never its modules (examples/chat is the template
    baked, checked in tests/integration/test_templates.py)."""
    import ast
    from pathlib import Path

    import app_toolkit.llm as llm

    project = Path(tk.__file__).parents[1] / "examples" / "chat"
    found: dict[str, set[str]] = {}
    for path in sorted(project.rglob("*.py")):
        if "node_modules" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("app_toolkit.llm"):
                found.setdefault(node.module or "", set()).update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                assert not any(alias.name.startswith("app_toolkit.llm") for alias in node.names), path
    assert set(found) == {"app_toolkit.llm"}, sorted(found)
    assert found["app_toolkit.llm"] <= set(llm.__all__), sorted(found["app_toolkit.llm"] - set(llm.__all__))


#: What ``import app_toolkit`` leaves for the code that needs it: Ray Serve (never), Ray
#: and the web stack (the backends and apps), the templates' engine (``app-toolkit new``),
#: Swagger UI's files (the /docs page) and the chat template's model libraries.
NOT_ON_IMPORT = (
    "ray.serve",
    "ray",
    "fastapi",
    "httpx",
    "cookiecutter",
    "fastapi_offline",
    "torch",
    "transformers",
)


def test_importing_never_imports_ray_serve_and_stays_light() -> None:
    code = f"import sys, app_toolkit; print(*(name in sys.modules for name in {NOT_ON_IMPORT!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"] * len(NOT_ON_IMPORT)


def test_the_version_has_one_source() -> None:
    """pyproject.toml takes the version from ``__version__`` (the built metadata's match is
    checked on a real wheel: tests/integration/test_templates.py, .ci/wheel_check.sh)."""
    import tomllib
    from pathlib import Path

    from packaging.version import Version

    project = tomllib.loads((Path(tk.__file__).parents[1] / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "app_toolkit.__version__"}
    assert str(Version(tk.__version__)) == tk.__version__  # a normalised PEP 440 version


def test_the_controller_and_proxy_processes_load_no_web_framework_they_do_not_need() -> None:
    # What a Ray worker imports to host the controller or a proxy (its actor classes).
    code = (
        "import sys; import app_toolkit._runtime.backends.ray.actors; "
        "print(*(name in sys.modules for name in ('fastapi', 'httpx', 'app_toolkit.route_table')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_names_shared_with_modules_are_the_public_functions() -> None:
    api, ingress = sys.modules["app_toolkit.api"], sys.modules["app_toolkit.ingress"]
    assert tk.status is api.status and tk.start is api.start and tk.run is api.run
    assert tk.App is ingress.App and tk.ingress is ingress.ingress
    with pytest.raises(AttributeError, match="no attribute 'stauts'"):
        tk.stauts  # noqa: B018


def test_exceptions_survive_pickling() -> None:
    import pickle

    for exc in (
        tk.BackPressureError("app/d", 3),
        tk.DeploymentCallError("KeyError", "x"),
        tk.DeployError("boom"),
        tk.ConfigError("bad"),
    ):
        clone = pickle.loads(pickle.dumps(exc))
        assert type(clone) is type(exc) and str(clone) == str(exc)
