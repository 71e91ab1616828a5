"""``@deployment``, ``.options()``, ``.bind()``: declaring what runs in replicas."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import NoReturn, overload

from app_toolkit.config import DeploymentConfig, parse_deployment_config
from app_toolkit.exceptions import ConfigError, DefinitionError

#: What a deployment serves: a class (one instance per replica) or a function.
Target = Callable[..., object]

logger = logging.getLogger("app_toolkit")


class Deployment:
    """A class or function that runs in replicas, with its options.

    Create one with :func:`deployment`; bind constructor arguments with :meth:`bind` to get
    an :class:`Application` that ``run()`` deploys.
    """

    def __init__(self, func_or_class: Target, name: str, options: Mapping[str, object]) -> None:
        self.func_or_class = func_or_class
        self.name = name
        self._options = dict(options)
        self.config: DeploymentConfig = parse_deployment_config(options, f"options of deployment {name!r}")
        _warn_about_unfillable_batches(func_or_class, name, self.config)

    def options(self, *, name: str | None = None, **options: object) -> Deployment:
        """A copy with some options changed (the others are kept).

        ``num_replicas`` and ``autoscaling_config`` replace each other.
        """
        kept = dict(self._options)
        if "num_replicas" in options:
            kept.pop("autoscaling_config", None)
        if "autoscaling_config" in options:
            kept.pop("num_replicas", None)
        return Deployment(self.func_or_class, name or self.name, {**kept, **options})

    def bind(self, *args: object, **kwargs: object) -> Application:
        """Fix constructor arguments; other bound deployments become handles."""
        if not inspect.isclass(self.func_or_class) and (args or kwargs):
            raise ConfigError(
                f"Deployment {self.name!r} is a function; it takes no constructor arguments, "
                "so call .bind() without arguments"
            )
        return Application(self, args, kwargs)

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise ConfigError(
            f"Deployment {self.name!r} cannot be called directly; use "
            f"{self.name}.bind(...) and run() it, then call it through its handle"
        )

    def __repr__(self) -> str:
        return f"Deployment(name={self.name!r})"


def _warn_about_unfillable_batches(target: Target, name: str, config: DeploymentConfig) -> None:
    if not inspect.isclass(target):
        return
    from app_toolkit.batching import batched_methods

    for method, batch in batched_methods(target).items():
        wanted = batch.max_batch_size * batch.max_concurrent_batches
        if wanted > config.max_ongoing_requests:
            logger.warning(
                "%s.%s: max_batch_size * max_concurrent_batches = %d but max_ongoing_requests "
                "is %d, so its batches can never fill; raise max_ongoing_requests to at least %d",
                name,
                method,
                wanted,
                config.max_ongoing_requests,
                wanted,
            )


class Application:
    """A deployment with bound arguments: the root of a deployable graph."""

    def __init__(
        self,
        deployment: Deployment,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        *,
        name: str | None = None,
        route_prefix: str | None = None,
    ) -> None:
        self.deployment = deployment
        self.args = args
        self.kwargs = kwargs
        #: Defaults for ``run()`` (set by ``App``); ``run()`` arguments override them.
        self.default_name = name
        self.default_route_prefix = route_prefix

    def __repr__(self) -> str:
        return f"Application({self.deployment.name!r})"


@overload
def deployment(_func_or_class: Target, /) -> Deployment: ...


@overload
def deployment(
    _name: str | None = None, /, *, name: str | None = None, **options: object
) -> Callable[[Target], Deployment]: ...


def deployment(
    _func_or_class: Target | str | None = None, /, *, name: str | None = None, **options: object
) -> Deployment | Callable[[Target], Deployment]:
    """Turn a class or function into a deployment.

    Use bare (``@deployment``) or with options (``@deployment(num_replicas=2)``); a name
    may come first (``@deployment("Model", num_replicas=2)``). Options are validated at
    once; see :class:`~app_toolkit.config.DeploymentConfig`.
    """
    if isinstance(_func_or_class, str):
        if name is not None and name != _func_or_class:
            raise ConfigError(f"@deployment got two names, {_func_or_class!r} and name={name!r}; keep one")
        name, _func_or_class = _func_or_class, None

    def wrap(target: Target) -> Deployment:
        if isinstance(target, Deployment):
            raise ConfigError("@deployment was applied twice; use .options(...) to change options")
        if not (inspect.isclass(target) or callable(target)):
            raise DefinitionError(f"@deployment needs a class or function, got {type(target).__name__}")
        return Deployment(target, name or str(getattr(target, "__name__", "deployment")), options)

    if _func_or_class is not None:
        return wrap(_func_or_class)
    return wrap
