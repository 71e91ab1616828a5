"""Deploying and managing applications: ``run``, ``delete``, ``status``, ``shutdown``…

Ray Serve's names and meanings; ``backend="local"`` runs the same parts in this process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from app_toolkit._runtime import request_context
from app_toolkit._runtime.backends.base import (
    current_session,
    resolve_backend_name,
    session_factory,
    set_current_session,
)
from app_toolkit._runtime.session import Session
from app_toolkit.build import build_app, reloaded, renewed
from app_toolkit.config import (
    ApplicationOptions,
    AutoscalingPolicy,
    HTTPOptions,
    LoggingConfig,
    parse_application_options,
    parse_http_options,
    parse_options,
)
from app_toolkit.config.http import checked
from app_toolkit.deployment import Application
from app_toolkit.exceptions import ConfigError, DeployError
from app_toolkit.handle import DeploymentHandle
from app_toolkit.status import ApplicationStatus, DeploymentStatus, DeploymentStatusInfo, ServeStatus

logger = logging.getLogger("app_toolkit")

_UNSET: Any = object()
_POLL_S = 0.05


def start(
    *,
    http_options: HTTPOptions | dict[str, Any] | None = None,
    backend: str = "auto",
    address: str | None = None,
    proxy_location: str | None = None,
) -> Session:
    """Start (or join) the toolkit: controller and HTTP proxies.

    ``backend="auto"`` uses the backend already running in this process, else Ray.
    ``backend="ray"`` joins ``address`` (``"auto"``, ``ray://…``, or RAY_ADDRESS) or starts
    an embedded local Ray; ``backend="local"`` runs everything in this process.
    ``proxy_location`` (``"EveryNode"`` or ``"HeadOnly"``) is a shortcut for that HTTP option.
    """
    http = _http_options(http_options)
    if proxy_location is not None:
        http = parse_http_options({**http.model_dump(), "proxy_location": proxy_location})
    name = resolve_backend_name(backend)
    session = current_session(create=False)
    if session is not None:
        # "auto" means whatever already runs in this process; a named backend must match.
        if backend != "auto" and session.backend_name != name:
            raise ConfigError(
                f"The {session.backend_name!r} backend is already running in this process; "
                "call shutdown() before starting another backend"
            )
        return session
    session = session_factory(name).start(address, http)
    set_current_session(session)
    return session


@dataclass(frozen=True)
class RunTarget:
    """One application for :func:`run_many` (Ray Serve's ``RunTarget``): its ingress
    ``target`` and how :func:`run` would be told to run it.

    ``name`` None: the application's own default name (``App(..., name=)``), else
    "default"; ``route_prefix`` left out: its own default, else "/" (None serves no HTTP).
    ``autoscaling_policy`` is the toolkit's, as in :func:`run`; ``external_scaler_enabled``
    is Ray Serve's and taken only as False (there is no external scaling API).
    """

    target: Application
    name: str | None = None
    route_prefix: str | None = _UNSET
    logging_config: LoggingConfig | dict[str, Any] | None = None
    external_scaler_enabled: bool = False
    autoscaling_policy: AutoscalingPolicy | str | Callable[..., Any] | None = None


def run(
    target: Application,
    blocking: bool = False,
    name: str | None = None,
    route_prefix: str | None = _UNSET,
    logging_config: LoggingConfig | dict[str, Any] | None = None,
    _local_testing_mode: bool = False,
    external_scaler_enabled: bool = False,
    *,
    backend: str = "auto",
    autoscaling_policy: AutoscalingPolicy | str | Callable[..., Any] | None = None,
    _reload: bool = False,
) -> DeploymentHandle:
    """Deploy ``target`` as an application and wait until it is running (and every
    proxy routes its prefix, waiting up to 5 s for a proxy that lags).

    The parameters up to ``external_scaler_enabled`` are Ray Serve 2.60's, in its order;
    the toolkit's own (``backend``, ``autoscaling_policy``) are keyword-only.

    Returns a handle to its ingress deployment. Running an app of the same name again
    upgrades it: every replica is replaced, though nothing changed, as Ray Serve's
    ``serve.run`` does (a config file's deploy changes light options in place). Raises
    DeployError with the replica's message if it fails. ``_reload`` (``app-toolkit run
    --reload``): only deployments whose code or heavy options changed are replaced, and
    the replicas it replaces end their streams as soon as they start draining.
    ``autoscaling_policy`` (a function, its import path or an ``AutoscalingPolicy``)
    decides the replicas of all the application's autoscaled deployments at once, as a
    config file's application ``autoscaling_policy`` does (Ray Serve sets it in files
    only; docs/autoscaling.md). ``logging_config`` (a dict or a ``LoggingConfig``) is the
    one of every deployment that sets none of its own (docs/observability.md).
    """
    one = RunTarget(target, name, route_prefix, logging_config, external_scaler_enabled, autoscaling_policy)
    handles = _run_targets(
        [one], "run() takes an application", blocking, True, backend, _local_testing_mode, _reload
    )
    return handles[0]


def run_many(
    targets: Sequence[RunTarget],
    blocking: bool = False,
    wait_for_ingress_deployment_creation: bool = True,
    wait_for_applications_running: bool = True,
    _local_testing_mode: bool = False,
    *,
    backend: str = "auto",
    _reload: bool = False,
) -> list[DeploymentHandle]:
    """Deploy several applications in one step and return their ingress handles, in
    order (Ray Serve's ``serve.run_many``: its parameters, in its order, without
    ``controller_options``; ``backend`` is keyword-only).

    Every target is checked and built before any is deployed; the controller takes them
    all at once (their route prefixes checked against each other and the running
    applications). Then, as :func:`run` does, it waits until each is running, unless
    ``wait_for_applications_running`` is False (it returns once they are recorded: their
    deployments exist, so ``wait_for_ingress_deployment_creation`` needs no wait here).
    """
    if not targets:
        raise ConfigError("run_many() needs at least one RunTarget: no applications provided.")
    return _run_targets(
        targets,
        "run_many() takes RunTarget(app, ...) items whose app is an application",
        blocking,
        wait_for_applications_running,
        backend,
        _local_testing_mode,
        _reload,
    )


def _run_targets(
    targets: Sequence[RunTarget],
    takes: str,
    blocking: bool,
    wait_for_applications_running: bool,
    backend: str,
    local_testing_mode: bool,
    reload: bool,
) -> list[DeploymentHandle]:
    """:func:`run_many`'s work, for it and :func:`run`; ``takes`` begins the error that
    names what the caller takes."""
    checked = [_checked(target, takes) for target in targets]
    names = [options.name for options, _, _ in checked]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"run_many() got application name(s) {', '.join(map(repr, twice))} more than once")
    if local_testing_mode:  # Ray Serve's: in this process, handles only (no HTTP server)
        session = start(backend="local", proxy_location="Disabled")
    else:
        session = start(backend=backend)
    specs = []
    for target, (options, logging_config, policy) in zip(targets, checked, strict=True):
        spec = build_app(
            target.target, options.name, options.route_prefix, session.serialize, None, policy, logging_config
        )
        specs.append(reloaded(spec) if reload else renewed(spec))
    session.deploy(*specs)
    if wait_for_applications_running:
        for spec in specs:
            # A reload returns once the new code serves: the old replicas drain meanwhile.
            wait_for_application(session, spec.name, serving_is_enough=reload)
    handles = [DeploymentHandle(spec.ingress, spec.name) for spec in specs]
    if blocking:
        _block_until_interrupted(session)
    return handles


def _checked(
    target: RunTarget, takes: str
) -> tuple[ApplicationOptions, LoggingConfig | None, AutoscalingPolicy | None]:
    """A run target's application options, logging config and policy, validated."""
    if not isinstance(target, RunTarget):
        raise ConfigError(f"run_many() takes RunTarget(app, name=...) items, got {type(target).__name__}")
    app = target.target
    if not isinstance(app, Application):
        raise ConfigError(f"{takes} such as MyDeployment.bind() or App(router), got {type(app).__name__}")
    name = target.name or app.default_name or "default"
    route_prefix = target.route_prefix
    if route_prefix is _UNSET:
        route_prefix = app.default_route_prefix if app.default_route_prefix else "/"
    options = parse_application_options(name, route_prefix, target.external_scaler_enabled)
    logging_config = target.logging_config
    if isinstance(logging_config, dict):
        logging_config = parse_options(LoggingConfig, logging_config, "logging_config")
    return options, logging_config, _app_policy(target.autoscaling_policy)


def _app_policy(value: AutoscalingPolicy | str | Callable[..., Any] | None) -> AutoscalingPolicy | None:
    if value is None or isinstance(value, AutoscalingPolicy):
        return value
    return parse_options(AutoscalingPolicy, {"policy_function": value}, "autoscaling_policy")


def wait_for_application(
    session: Session, name: str, timeout_s: float | None = None, serving_is_enough: bool = False
) -> None:
    """Block until ``name`` runs; raise DeployError with its message if it fails (or is
    not running after ``timeout_s``). ``serving_is_enough``: return once every deployment
    serves its new version at its target, old replicas still draining."""
    last_report = began = time.monotonic()
    while True:
        if timeout_s is not None and time.monotonic() - began > timeout_s:
            app = session.status().applications.get(name)
            raise DeployError(
                f"Application {name!r} is not running after {timeout_s:.0f} s: {app.message if app else ''}"
            )
        app = session.status().applications.get(name)
        if app is not None and app.status is ApplicationStatus.RUNNING:
            return
        if (
            app is not None
            and serving_is_enough
            and all(map(_serves_its_new_version, app.deployments.values()))
        ):
            return
        if app is not None and app.status is ApplicationStatus.DEPLOY_FAILED:
            raise DeployError(f"Application {name!r} failed to deploy: {app.message}")
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            logger.warning("Application %r is still deploying: %s", name, app.message if app else "")
        time.sleep(_POLL_S)


def _serves_its_new_version(deployment: DeploymentStatusInfo) -> bool:
    """Running at its target, or upgrading with every new replica running (old ones drain)."""
    if deployment.status is DeploymentStatus.HEALTHY:
        return True
    upgrade = deployment.upgrade
    return (
        upgrade is not None and upgrade.mode != "rollback" and upgrade.new_replicas >= upgrade.target_replicas
    )


def delete(name: str, _blocking: bool = True) -> None:
    """Delete an application: its routes 404 at once and its replicas stop."""
    session = current_session()
    assert session is not None
    session.delete(name)
    while _blocking and not session.app_gone(name):
        time.sleep(_POLL_S)


def status() -> ServeStatus:
    """Applications → deployments → replicas, with their states.

    Starts nothing: with no toolkit running (in this process, or on the cluster that
    ``RAY_ADDRESS`` names), the status is empty, as in Ray Serve.
    """
    session = current_session(create=False) or session_factory("auto").find(None)
    if session is None:
        return ServeStatus()
    return session.status()


def shutdown() -> None:
    """Stop every application, the proxy and the controller."""
    session = current_session(create=False) or session_factory("auto").find(None)
    if session is None:
        return
    session.shutdown()
    set_current_session(None)


def get_app_handle(name: str) -> DeploymentHandle:
    """A handle to the ingress deployment of a running application."""
    applications = status().applications
    app = applications.get(name)
    if app is None:
        raise _no_such_application(name, applications)
    return DeploymentHandle(app.ingress, name)


def get_deployment_handle(deployment_name: str, app_name: str | None = None) -> DeploymentHandle:
    """A handle to one deployment of a running application.

    ``app_name`` defaults to the caller's own application inside a replica, else "default".
    """
    app_name = app_name or request_context.app_name.get() or "default"
    applications = status().applications
    app = applications.get(app_name)
    if app is None:
        raise _no_such_application(app_name, applications)
    if deployment_name not in app.deployments:
        known = ", ".join(sorted(app.deployments)) or "none"
        raise ConfigError(f"Application {app_name!r} has no deployment {deployment_name!r} (it has: {known})")
    return DeploymentHandle(deployment_name, app_name)


def _no_such_application(name: str, running_apps: Iterable[str]) -> ConfigError:
    """Ray Serve's words (a RayServeException), then what is running."""
    running = ", ".join(repr(app) for app in sorted(running_apps)) or "none"
    return ConfigError(f"Application {name!r} does not exist. Running: {running}; run() it first")


def _http_options(value: HTTPOptions | dict[str, Any] | None) -> HTTPOptions:
    if value is None:
        return HTTPOptions()
    if isinstance(value, HTTPOptions):
        return checked(value)
    return parse_http_options(value)


def _block_until_interrupted(session: Session) -> None:
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        logger.info("Shutting down")
        shutdown()
