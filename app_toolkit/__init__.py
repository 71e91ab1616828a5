"""app_toolkit: serve ordinary FastAPI routers as a scalable service on Ray."""

import typing as _typing

from app_toolkit.api import (
    RunTarget,
    delete,
    get_app_handle,
    get_deployment_handle,
    run,
    run_many,
    shutdown,
    start,
    status,
)
from app_toolkit.autoscaling_policy import AutoscalingContext
from app_toolkit.batching import batch
from app_toolkit.config import (
    AutoscalingConfig,
    AutoscalingPolicy,
    BackpressureConfig,
    BatchConfig,
    DeploymentConfig,
    HTTPOptions,
    LoggingConfig,
    RayActorOptions,
)
from app_toolkit.context import (
    ReplicaContext,
    ReplicaRank,
    admit_key,
    api_key_name,
    charge_tokens,
    count_request,
    get_replica_context,
    get_request_id,
    get_request_priority,
    meters_tokens,
)
from app_toolkit.continuable import continuable
from app_toolkit.dependencies import Depends
from app_toolkit.deployment import Application, Deployment, deployment
from app_toolkit.event_log import (
    EventLog,
    LoggedEvent,
    MemoryEventLog,
    StreamAbandoned,
    UnknownStream,
    WriterReplaced,
)
from app_toolkit.event_log_redis import RedisEventLog
from app_toolkit.exceptions import (
    APIKeyRefused,
    AppToolkitError,
    BackPressureError,
    ConfigError,
    ContinuationRefused,
    DefinitionError,
    DeployError,
    DeploymentCallError,
    MethodNotFoundError,
    RayServeException,
    ReplicaUnavailableError,
    RequestLostError,
    RequestTimeoutError,
)
from app_toolkit.handle import DeploymentHandle
from app_toolkit.ingress import App, ingress
from app_toolkit.multiplex import get_multiplexed_model_id, multiplexed
from app_toolkit.responses import DeploymentBroadcastResponse, DeploymentResponse, DeploymentResponseGenerator
from app_toolkit.routes import deadline, open_route, replicated
from app_toolkit.status import (
    ApplicationStatus,
    ApplicationStatusInfo,
    AutoscalingStatusInfo,
    DeploymentStatus,
    DeploymentStatusInfo,
    EventInfo,
    ProxyStatus,
    ReplicaState,
    ReplicaStatusInfo,
    RolloutStatusInfo,
    ServeStatus,
    ShadowStatusInfo,
    UpgradeStatusInfo,
)
from app_toolkit.streaming import ChatCompletionStream, EventStream, OpenAIErrorEvent
from app_toolkit.traffic import rollout, set_traffic, shadow

# The one source of the version: pyproject.toml reads this literal when the package is built.
__version__ = "0.1.0"

__all__ = [
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

if _typing.TYPE_CHECKING:
    from app_toolkit import testing


def __getattr__(name: str) -> object:
    # ``tk.testing`` (and its test client, httpx) is imported on first use: the toolkit's
    # own processes (controller, proxies, replicas) never need it.
    if name == "testing":
        import importlib

        return importlib.import_module("app_toolkit.testing")
    raise AttributeError(f"module 'app_toolkit' has no attribute {name!r}")
