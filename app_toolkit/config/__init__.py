"""One pydantic schema per option: defaults, bounds and descriptions live here only.

Decorator keyword arguments, ``.options()``, config files and CLI flags are all validated
by these models, and every failure becomes a :class:`~app_toolkit.exceptions.ConfigError`
whose message names the option, the bad value and the allowed range. (Config files:
``app_toolkit.config.file``.)
"""

from app_toolkit.config.application import ApplicationOptions, parse_application_options
from app_toolkit.config.autoscaling import AutoscalingConfig, AutoscalingPolicy
from app_toolkit.config.deployment import (
    BackpressureConfig,
    BatchConfig,
    DeploymentConfig,
    RayActorOptions,
    parse_batch_config,
    parse_deployment_config,
)
from app_toolkit.config.http import HTTPOptions, parse_http_options
from app_toolkit.config.logging_config import LoggingConfig, logs_access
from app_toolkit.config.schema import IN_PLACE, LOG_LEVEL_ENV, NAME_RE, default_of, parse_options
from app_toolkit.config.traffic import RolloutOptions, ShadowOptions

__all__ = [
    "IN_PLACE",
    "LOG_LEVEL_ENV",
    "NAME_RE",
    "ApplicationOptions",
    "AutoscalingConfig",
    "AutoscalingPolicy",
    "BackpressureConfig",
    "BatchConfig",
    "DeploymentConfig",
    "HTTPOptions",
    "LoggingConfig",
    "RayActorOptions",
    "RolloutOptions",
    "ShadowOptions",
    "default_of",
    "logs_access",
    "parse_application_options",
    "parse_batch_config",
    "parse_deployment_config",
    "parse_http_options",
    "parse_options",
]
