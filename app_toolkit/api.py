"""Deploying and managing applications: ``run``, ``delete``, ``status``, ``shutdown``…

Ray Serve's names and meanings; ``backend="local"`` runs the same parts in this process.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from app_toolkit._runtime import request_context
from app_toolkit._runtime.backends.base import (
    Session,
    current_session,
    resolve_backend_name,
    session_factory,
    set_current_session,
)
from app_toolkit._runtime.controller.rollout import RolloutOptions
from app_toolkit._runtime.messages import AppSpec, DeploymentID, DeploymentSpec
from app_toolkit._runtime.replica.replica import ASGI_APP_ATTR
from app_toolkit.config import HTTPOptions, parse_application_options, parse_http_options
from app_toolkit.deployment import Application, Deployment
from app_toolkit.exceptions import ConfigError, DeployError
from app_toolkit.handle import DeploymentHandle
from app_toolkit.route_table import route_table
from app_toolkit.status import ApplicationStatus, ServeStatus

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


def run(
    target: Application,
    *,
    name: str | None = None,
    route_prefix: str | None = _UNSET,
    blocking: bool = False,
    backend: str = "auto",
    _local_testing_mode: bool = False,
) -> DeploymentHandle:
    """Deploy ``target`` as an application and wait until it is running.

    Returns a handle to its ingress deployment. Redeploying an app of the same name
    updates it in place. Raises DeployError with the replica's message if it fails.
    """
    if not isinstance(target, Application):
        raise ConfigError(
            f"run() takes an application such as MyDeployment.bind() or App(router), "
            f"got {type(target).__name__}"
        )
    app_name = name or target.default_name or "default"
    if route_prefix is _UNSET:
        route_prefix = target.default_route_prefix if target.default_route_prefix else "/"
    options = parse_application_options(app_name, route_prefix)
    session = start(backend="local" if _local_testing_mode else backend)
    spec = build_app(target, options.name, options.route_prefix, session)
    session.deploy(spec)
    wait_for_application(session, options.name)
    handle = DeploymentHandle(spec.ingress, options.name)
    if blocking:
        _block_until_interrupted(session)
    return handle


class Serializer(Protocol):
    """What building an application needs of a session: the codec for user code."""

    def serialize(self, value: object) -> bytes: ...


def build_app(
    target: Application,
    name: str,
    route_prefix: str | None,
    session: Serializer,
    configure: Callable[[Deployment], Deployment] | None = None,
) -> AppSpec:
    """Walk the bound graph; bound deployments in arguments become handles.

    ``configure`` may replace each deployment (and pool) with a copy of other options
    (a config file's overrides).
    """
    specs: dict[str, DeploymentSpec] = {}
    # Bound node -> its deployment name. The node is kept too: an id is unique only while
    # its object lives, and the pools below are temporary nodes (a freed one's id can come
    # back for the next, which then looked visited and was left out of the app).
    names: dict[int, tuple[Application, str]] = {}

    def visit(node: Application) -> str:
        if id(node) in names:
            return names[id(node)][1]
        deployment = node.deployment
        if deployment.name in specs or any(seen == deployment.name for _, seen in names.values()):
            raise ConfigError(
                f"Application {name!r} has two deployments named {deployment.name!r}; give one "
                f"another name with .options(name=...)"
            )
        names[id(node)] = (node, deployment.name)
        if configure is not None:
            deployment = configure(deployment)
        args = tuple(replace(arg) for arg in node.args)
        kwargs = {key: replace(value) for key, value in node.kwargs.items()}
        try:
            definition = session.serialize(deployment.func_or_class)
            init_args = session.serialize((args, kwargs))
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
            raise ConfigError(
                f"Deployment {deployment.name!r} of application {name!r} cannot be sent to its "
                f"replicas: {exc}. Keep its code importable or picklable, and its arguments "
                "plain data, handles or importable objects."
            ) from None
        config = deployment.config
        version = hashlib.sha256(
            definition + init_args + config.model_dump_json(exclude=set(config.in_place_options())).encode()
        ).hexdigest()[:16]
        specs[deployment.name] = DeploymentSpec(
            id=DeploymentID(name, deployment.name),
            definition=definition,
            init_args=init_args,
            config=config,
            is_asgi=hasattr(deployment.func_or_class, ASGI_APP_ATTR),
            code_version=version,
        )
        return deployment.name

    def replace(value: Any) -> Any:
        if isinstance(value, Application):
            return DeploymentHandle(visit(value), name)
        if isinstance(value, (list, tuple)):
            return type(value)(replace(item) for item in value)
        if isinstance(value, dict):
            return {key: replace(item) for key, item in value.items()}
        return value

    ingress = visit(target)
    asgi = getattr(target.deployment.func_or_class, ASGI_APP_ATTR, None)
    table = route_table(asgi) if asgi is not None else None
    if table is None:
        return AppSpec(name, route_prefix, ingress, tuple(specs.values()))
    # A @replicated route's pool runs the ingress's own class and arguments with the
    # pool's options; the proxy sends it only its routes' requests.
    for pool, options in table.pools.items():
        visit(
            Application(
                Deployment(target.deployment.func_or_class, pool, options), target.args, target.kwargs
            )
        )
    return AppSpec(name, route_prefix, ingress, tuple(specs.values()), table.routes, table.paths)


def wait_for_application(session: Session, name: str, timeout_s: float | None = None) -> None:
    """Block until ``name`` runs; raise DeployError with its message if it fails (or is
    not running after ``timeout_s``)."""
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
        if app is not None and app.status is ApplicationStatus.DEPLOY_FAILED:
            raise DeployError(f"Application {name!r} failed to deploy: {app.message}")
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            logger.warning("Application %r is still deploying: %s", name, app.message if app else "")
        time.sleep(_POLL_S)


def delete(name: str, _blocking: bool = True) -> None:
    """Delete an application: its routes 404 at once and its replicas stop."""
    session = current_session()
    assert session is not None
    session.delete(name)
    while _blocking and not session.app_gone(name):
        time.sleep(_POLL_S)


def set_traffic(app: str, weights: dict[str, float]) -> None:
    """Split the traffic of application ``app`` (its route and its handle) between
    applications by weight, e.g. ``set_traffic("chat", {"chat": 90, "chat-v2": 10})``.
    Weights are in any unit (they are scaled to add up to 1); ``app`` may be one of its
    own variants, and ``{app: 1}`` ends the split. ``app`` may also name one deployment,
    ``"app/Model"``: the calls to it through handles are split between deployments of the
    same application (``{"Model": 90, "ModelV2": 10}``). Every caller applies it per request
    from its next table update (well under a second); nothing restarts. A request with a
    shard key sees the same variant while the weights stay the same."""
    session = current_session(create=False) or session_factory("auto").find(None)
    if session is None:
        raise ConfigError("Nothing is running: deploy the applications before splitting traffic")
    session.set_traffic(app, dict(weights))


def rollout(
    app: str,
    *,
    to: str,
    steps: Sequence[float] = (1, 10, 50, 100),
    interval_s: float = 60.0,
    max_error_rate: float | None = 0.01,
    max_p99_ms: float | None = None,
) -> None:
    """Move application ``app``'s traffic to the application ``to`` step by step: ``steps``
    are the canary's percentages, each held for ``interval_s``. While a step runs, the
    canary's requests are watched (at every caller); when more than ``max_error_rate`` of
    them fail, or their p99 latency exceeds ``max_p99_ms``, the traffic goes back to
    ``app`` at once. Returns when the first step is in place; ``status()`` shows the
    steps and, after a rollback, why."""
    session = current_session(create=False) or session_factory("auto").find(None)
    if session is None:
        raise ConfigError("Nothing is running: deploy the applications before a rollout")
    options = RolloutOptions(tuple(float(step) for step in steps), interval_s, max_error_rate, max_p99_ms)
    session.rollout(app, to, options)


def shadow(app: str, *, to: str | None, fraction: float = 0.1, compare: str | None = None) -> None:
    """Copy ``fraction`` of application ``app``'s requests (HTTP and handle calls) to the
    application ``to``: its answers are compared with the primary's (status, latency)
    into ``status()`` and thrown away. ``compare`` ("module:function") also compares
    bodies: it gets the primary's and the shadow's (HTTP body bytes, or call results)
    and returns whether they agree. The primary never waits for its shadow; copies the
    shadow cannot take in time are dropped and counted. Streams and WebSockets are not
    copied. ``to=None`` stops it."""
    session = current_session(create=False) or session_factory("auto").find(None)
    if session is None:
        raise ConfigError("Nothing is running: deploy the applications before a shadow")
    session.shadow(app, to, fraction, compare or "")


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
    app = status().applications.get(name)
    if app is None:
        raise ConfigError(f"No application named {name!r} is running; run() it first")
    return DeploymentHandle(app.ingress, name)


def get_deployment_handle(deployment_name: str, app_name: str | None = None) -> DeploymentHandle:
    """A handle to one deployment of a running application.

    ``app_name`` defaults to the caller's own application inside a replica, else "default".
    """
    app_name = app_name or request_context.app_name.get() or "default"
    app = status().applications.get(app_name)
    if app is None:
        raise ConfigError(f"No application named {app_name!r} is running; run() it first")
    if deployment_name not in app.deployments:
        known = ", ".join(sorted(app.deployments)) or "none"
        raise ConfigError(f"Application {app_name!r} has no deployment {deployment_name!r} (it has: {known})")
    return DeploymentHandle(deployment_name, app_name)


def _http_options(value: HTTPOptions | dict[str, Any] | None) -> HTTPOptions:
    if value is None:
        return HTTPOptions()
    if isinstance(value, HTTPOptions):
        return value
    return parse_http_options(value)


def _block_until_interrupted(session: Session) -> None:
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        logger.info("Shutting down")
        shutdown()
