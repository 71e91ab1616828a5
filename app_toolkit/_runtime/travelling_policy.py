"""Custom autoscaling policies as the controller gets them: named by their import path,
their function serialized by value, since the controller imports nothing of the
application. :mod:`app_toolkit.build` readies an application's policy and each of its
deployments' so, as it builds the application's spec."""

from __future__ import annotations

from app_toolkit._runtime.messages import ByValue
from app_toolkit._runtime.session import Serialize
from app_toolkit.config import AutoscalingPolicy, DeploymentConfig
from app_toolkit.exceptions import ConfigError
from app_toolkit.import_path import import_attr


def travelling_policy(policy: AutoscalingPolicy, serialize: Serialize, field: str) -> AutoscalingPolicy:
    """``policy`` as the controller gets it: named by its import path, its function
    serialized by value (the controller imports nothing of the application). An import
    path is imported here; a failure names ``field``."""
    if policy.is_default:
        return policy
    function = policy.policy_function
    if isinstance(function, str):
        try:
            function = import_attr(function)
        except ConfigError as exc:
            raise ConfigError(f"{field}: {exc}") from None
    if not callable(function):
        raise ConfigError(f"{field}: {policy.name} is a {type(function).__name__}, not a function")
    try:
        data = serialize(ByValue(function))
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
        raise ConfigError(
            f"{field}: the policy {policy.name} cannot be sent to the controller: {exc}"
        ) from None
    return policy.travelling(data)


def travelling_config(config: DeploymentConfig, serialize: Serialize) -> DeploymentConfig:
    """``config`` with its custom autoscaling policy ready for the controller."""
    autoscaling = config.autoscaling_config
    if autoscaling is None or autoscaling.policy.is_default:
        return config
    policy = travelling_policy(autoscaling.policy, serialize, "autoscaling_config.policy.policy_function")
    return config.model_copy(update={"autoscaling_config": autoscaling.model_copy(update={"policy": policy})})
