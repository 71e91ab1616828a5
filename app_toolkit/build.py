"""Building applications: from a bound graph (code) or a config file's entry to the
:class:`AppSpec` the controller deploys. The one place that walks an application.

- :func:`build_app`: walk the bound graph from the ingress; bound deployments in
  arguments become handles; a FastAPI ingress's ``@replicated`` routes add their pools.
- :func:`build_spec`: a config entry's ``import_path`` (an application, a FastAPI app or
  router, or a builder function taking ``args``, as :mod:`app_toolkit.app_builder` says),
  with the entry's per-deployment options on top of the code's and the application's
  ``runtime_env`` on every replica. It runs where the replicas will (on Ray, a task under
  that ``runtime_env``), given as a :class:`~app_toolkit._runtime.session.Build`
  (:func:`builds`).
- :func:`describe`: the config file for applications in code (``app-toolkit build``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import io
import json
import logging
import pickle
import time
import typing
from collections.abc import Callable, Sequence
from typing import Any

from app_toolkit._runtime.continuation_marks import continuations_of
from app_toolkit._runtime.messages import AppSpec, DeploymentID, DeploymentSpec
from app_toolkit._runtime.replica.ingress_app import ASGI_APP_ATTR, ASGI_BUILDER_ATTR
from app_toolkit._runtime.session import Build, Serialize
from app_toolkit._runtime.travelling_policy import travelling_config, travelling_policy
from app_toolkit.app_builder import load_application
from app_toolkit.code_sources import code_name, sources_digest
from app_toolkit.config import AutoscalingPolicy, LoggingConfig
from app_toolkit.config.file import ApplicationConfig, parse_config
from app_toolkit.deployment import Application, Deployment
from app_toolkit.exceptions import BuilderArgsError, ConfigError
from app_toolkit.handle import DeploymentHandle

if typing.TYPE_CHECKING:  # FastAPI is imported where an app is built, not by every toolkit process
    from app_toolkit.route_table import RouteTable

logger = logging.getLogger("app_toolkit")


def build_app(
    target: Application,
    name: str,
    route_prefix: str | None,
    serialize: Serialize,
    configure: Callable[[Deployment], Deployment] | None = None,
    autoscaling_policy: AutoscalingPolicy | None = None,
    logging_config: LoggingConfig | None = None,
) -> AppSpec:
    """The spec of application ``name`` whose ingress is ``target``. ``configure`` may
    replace each deployment (and pool) with a copy of other options (a config file's
    overrides); ``autoscaling_policy`` decides for all its autoscaled deployments;
    ``logging_config`` is the one of every deployment that sets none."""
    spec = _build_graph(target, name, route_prefix, serialize, configure, logging_config)
    if autoscaling_policy is None or autoscaling_policy.is_default:
        return spec
    policy = travelling_policy(autoscaling_policy, serialize, "autoscaling_policy.policy_function")
    return dataclasses.replace(spec, autoscaling_policy=policy)


def _build_graph(
    target: Application,
    name: str,
    route_prefix: str | None,
    serialize: Serialize,
    configure: Callable[[Deployment], Deployment] | None,
    logging_config: LoggingConfig | None,
) -> AppSpec:
    graph = _Graph(name, serialize, configure, logging_config)
    ingress = graph.visit(target)
    if route_prefix is not None:
        graph.serves_http(ingress)
    table = _route_table(target)
    if table is None:
        return AppSpec(name, route_prefix, ingress, graph.specs())
    for line in table.hidden:  # served as Starlette serves it; said once, at deploy
        logger.warning("Application %r: %s", name, line)
    # A @replicated route's pool runs the ingress's own class and arguments with the
    # pool's options; the proxy sends it only its routes' requests.
    for pool, options in table.pools.items():
        graph.visit(
            Application(
                Deployment(target.deployment.func_or_class, pool, options), target.args, target.kwargs
            )
        )
    return AppSpec(name, route_prefix, ingress, graph.specs(), table.routes, table.paths, cors=table.cors)


def renewed(spec: AppSpec) -> AppSpec:
    """``spec`` as a new version of each of its deployments, though nothing in it changed:
    every replica is replaced (an upgrade). ``run()`` from Python deploys so, as Ray
    Serve's ``serve.run`` does (how new model files at the same path are picked up); a
    config file deployed again unchanged is a no-op, as ``serve deploy``'s is, and
    ``--reload`` replaces only what changed (:mod:`app_toolkit.code_sources`)."""
    suffix = f"+{time.time_ns():x}"
    deployments = [dataclasses.replace(d, code_version=d.code_version + suffix) for d in spec.deployments]
    return dataclasses.replace(spec, deployments=tuple(deployments))


def reloaded(spec: AppSpec) -> AppSpec:
    """``spec`` as ``app-toolkit run --reload`` deploys it: the replicas it replaces end
    their streams as their drain starts (a fast reload), not at its deadline."""
    deployments = tuple(dataclasses.replace(d, reloaded=True) for d in spec.deployments)
    return dataclasses.replace(spec, deployments=deployments)


def _route_table(target: Application) -> RouteTable | None:
    """The ingress's routes with pools or deadlines (None: it is not an ASGI ingress)."""
    asgi = getattr(target.deployment.func_or_class, ASGI_APP_ATTR, None)
    if asgi is None:
        return None
    from app_toolkit.route_table import route_table

    return route_table(asgi)


class _Graph:
    """The deployments of one application, met while walking its bound graph."""

    def __init__(
        self,
        app: str,
        serialize: Serialize,
        configure: Callable[[Deployment], Deployment] | None,
        logging_config: LoggingConfig | None,
    ) -> None:
        self.app = app
        self._serialize = serialize
        self._configure = configure
        self._logging = logging_config  # the application's: for deployments with none
        self._specs: dict[str, DeploymentSpec] = {}
        # Bound node -> its deployment name. The node is kept too: an id is unique only
        # while its object lives, and pools are temporary nodes (a freed one's id can
        # come back for the next, which then looked visited and was left out).
        self._names: dict[int, tuple[Application, str]] = {}

    def specs(self) -> tuple[DeploymentSpec, ...]:
        return tuple(self._specs.values())

    def visit(self, node: Application) -> str:
        """Add ``node``'s deployment (and what its arguments bind) once; returns its name."""
        if id(node) in self._names:
            return self._names[id(node)][1]
        deployment = node.deployment
        taken = {seen for _, seen in self._names.values()}
        if deployment.name in taken:
            # Another node of the same name (one class bound twice): Name_1, Name_2, ... as
            # Ray Serve names them.
            number = 1
            while f"{deployment.name}_{number}" in taken:
                number += 1
            deployment = deployment.options(name=f"{deployment.name}_{number}")
        self._names[id(node)] = (node, deployment.name)
        if self._configure is not None:
            deployment = self._configure(deployment)
        args = tuple(self._handles_for(arg) for arg in node.args)
        kwargs = {key: self._handles_for(value) for key, value in node.kwargs.items()}
        try:
            definition = self._serialize(deployment.func_or_class)
            init_args = self._serialize((args, kwargs))
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
            raise ConfigError(
                f"Deployment {deployment.name!r} of application {self.app!r} cannot be sent to its "
                f"replicas: {exc}. Keep its code importable or picklable, and its arguments "
                "plain data, handles or importable objects."
            ) from None
        config = deployment.config
        if config.logging_config is None and self._logging is not None:  # Ray Serve's rule
            config = config.model_copy(update={"logging_config": self._logging})
        try:
            config = travelling_config(config, self._serialize)
        except ConfigError as exc:
            raise ConfigError(f"Deployment {deployment.name!r} of application {self.app!r}: {exc}") from None
        heavy = config.model_dump_json(exclude=set(config.in_place_options())).encode()
        sources = sources_digest(deployment.func_or_class)
        # Code with a name is known by it and its source files: a re-import (``--reload``)
        # makes another object of it, which serializes to other bytes (the local backend's
        # key, cloudpickle's class tracker id), though the code is the same.
        by_name = code_name(deployment.func_or_class)
        code = definition if by_name is None else by_name.encode()
        self._specs[deployment.name] = DeploymentSpec(
            id=DeploymentID(self.app, deployment.name),
            definition=definition,
            init_args=init_args,
            config=config,
            is_asgi=hasattr(deployment.func_or_class, ASGI_APP_ATTR)
            or hasattr(deployment.func_or_class, ASGI_BUILDER_ATTR),
            code_version=hashlib.sha256(code + init_args + heavy + sources.encode()).hexdigest()[:16],
            sources=sources,
            continuations=continuations_of(deployment.func_or_class),
        )
        return deployment.name

    def serves_http(self, name: str) -> None:
        """Deployment ``name`` is the application's HTTP ingress."""
        self._specs[name] = dataclasses.replace(self._specs[name], http_ingress=True)

    def _handles_for(self, value: object) -> object:
        """``value`` with every bound deployment in it replaced by a handle to it."""
        if isinstance(value, Application):
            return DeploymentHandle(self.visit(value), self.app)
        if isinstance(value, list | tuple):
            return type(value)(self._handles_for(item) for item in value)
        if isinstance(value, dict):
            return {key: self._handles_for(item) for key, item in value.items()}
        if value is None or isinstance(value, str | bytes | int | float | bool):
            return value
        return self._handles_inside(value)

    def _handles_inside(self, value: object) -> object:
        """An object holding bound deployments (in its attributes, anywhere) comes back as
        a copy holding handles, as Ray Serve does; one holding none comes back as it is.
        Large buffers are not copied."""
        stream, buffers = io.BytesIO(), list[pickle.PickleBuffer]()
        swapper = _HandleSwapper(stream, self, buffers)
        try:
            swapper.dump(value)
        except Exception:  # noqa: BLE001 - not picklable here (a class defined in a function)
            return self._handles_in_attributes(value)
        return pickle.loads(stream.getvalue(), buffers=buffers) if swapper.swapped else value

    def _handles_in_attributes(self, value: object) -> object:
        """An object plain pickle cannot copy (its class defined in a function, which
        cloudpickle sends by value later): a shallow copy with the bound deployments in its
        attributes replaced, if it has any."""
        attributes = getattr(value, "__dict__", None)
        if not isinstance(attributes, dict):
            return value
        swapped = {key: self._handles_for(item) for key, item in attributes.items()}
        if all(swapped[key] is item for key, item in attributes.items()):
            return value
        copied = copy.copy(value)
        copied.__dict__.update(swapped)
        return copied


class _HandleSwapper(pickle.Pickler):
    """Pickles an object with each bound deployment in it replaced by a handle."""

    def __init__(self, stream: io.BytesIO, graph: _Graph, buffers: list[pickle.PickleBuffer]) -> None:
        super().__init__(stream, protocol=5, buffer_callback=buffers.append)
        self._graph = graph
        self.swapped = False

    def reducer_override(self, obj: object) -> Any:  # Any: pickle's own NotImplemented protocol
        if isinstance(obj, Application):
            self.swapped = True
            return DeploymentHandle(self._graph.visit(obj), self._graph.app).__reduce__()
        return NotImplemented


def configure(app: ApplicationConfig) -> Callable[[Deployment], Deployment]:
    """The entry's options for each deployment, and its runtime_env for every replica."""
    overrides = {entry.name: entry.options for entry in app.deployments}

    def apply(deployment: Deployment) -> Deployment:
        options = dict(overrides.get(deployment.name, {}))
        if app.runtime_env:
            actor = {
                **deployment.config.ray_actor_options.model_dump(),
                **options.get("ray_actor_options", {}),
            }
            actor["runtime_env"] = {**app.runtime_env, **(actor.get("runtime_env") or {})}
            options["ray_actor_options"] = actor
        return deployment.options(**options) if options else deployment

    return apply


def check_overrides(app: ApplicationConfig, deployed: list[str]) -> None:
    """Every deployment the entry names must be in the application."""
    unknown = [entry.name for entry in app.deployments if entry.name not in deployed]
    if unknown:
        raise ConfigError(
            f"deployments: {unknown[0]!r} is not a deployment of "
            f"{app.import_path} (it has: {', '.join(sorted(deployed))})"
        )


def build_spec(app: ApplicationConfig, serialize: Serialize) -> AppSpec:
    """Import, configure and build one application entry (in the process that will
    prove the import: a Ray task under its runtime_env, or this one on the local backend)."""
    try:
        target = load_application(app.import_path, app.args, app.name)
    except BuilderArgsError as exc:
        raise BuilderArgsError(f"args: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"import_path: {exc}") from None
    spec = build_app(
        target,
        app.name,
        app.route_prefix,
        serialize,
        configure(app),
        app.autoscaling_policy,
        app.logging_config,
    )
    check_overrides(app, [deployment.id.name for deployment in spec.deployments])
    return dataclasses.replace(spec, deployments=tuple(_versioned(app, d) for d in spec.deployments))


def builds(apps: Sequence[ApplicationConfig]) -> list[Build]:
    """A config file's applications, each to be built where its replicas run."""
    return [Build(app.name, app.runtime_env, functools.partial(build_spec, app)) for app in apps]


def _versioned(app: ApplicationConfig, spec: DeploymentSpec) -> DeploymentSpec:
    """A file's deployment keeps its replicas while its entry's code (import path,
    runtime_env, args), the source files its code depends on and its heavy options stay
    the same: code built in another process pickles to other bytes, so the bytes cannot
    tell."""
    code = [app.import_path, app.runtime_env, app.args, spec.id.name, spec.sources]
    entry = json.dumps(code, sort_keys=True, default=str)
    heavy = spec.config.model_dump_json(exclude=set(spec.config.in_place_options()))
    version = hashlib.sha256((entry + heavy).encode()).hexdigest()[:16]
    return dataclasses.replace(spec, code_version=version)


def describe(paths: Sequence[str]) -> dict[str, object]:
    """A config file for the applications at ``paths``, with the options set in code
    (``app-toolkit build``); it validates as written."""
    applications: list[dict[str, object]] = []
    for index, path in enumerate(paths):
        target = load_application(path, {}, None)
        name = target.default_name or ("default" if len(paths) == 1 else f"app{index + 1}")
        if any(app["name"] == name for app in applications):
            name = f"{name}{index + 1}"
        prefix = target.default_route_prefix or "/"
        if any(app["route_prefix"] == prefix for app in applications):
            prefix = f"/{name}"
        applications.append(
            {
                "name": name,
                "route_prefix": prefix,
                "import_path": path,
                "runtime_env": {},
                "deployments": [_options_in_code(d) for d in _deployments(target)],
            }
        )
    config: dict[str, object] = {
        "proxy_location": "EveryNode",
        "http_options": {"host": "127.0.0.1", "port": 8000},
        "applications": applications,
    }
    parse_config(config, "the built config")
    return config


def _deployments(target: Application) -> list[Deployment]:
    """Every deployment of an application's graph (and its route pools), ingress first."""
    found: dict[str, Deployment] = {}

    def walk(value: object) -> None:
        if isinstance(value, Application):
            found.setdefault(value.deployment.name, value.deployment)
            for item in [*value.args, *value.kwargs.values()]:
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(target)
    table = _route_table(target)
    for pool, options in table.pools.items() if table is not None else ():
        found.setdefault(pool, Deployment(target.deployment.func_or_class, pool, options))
    return list(found.values())


def _options_in_code(deployment: Deployment) -> dict[str, object]:
    config = deployment.config
    return {"name": deployment.name, **config.model_dump(mode="json", exclude_unset=True)}
