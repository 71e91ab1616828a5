"""Exceptions raised by app_toolkit.

The tree::

    AppToolkitError            (also named RayServeException, Ray Serve's base)
    ├── ConfigError            bad option, bad import path, bad route prefix (a ValueError)
    │   ├── DefinitionError    a decorator applied to what it cannot take (also a TypeError)
    │   └── BuilderArgsError   arguments an application builder cannot take (a config
    │                          file's ``args``, ``app-toolkit run``'s KEY=VALUE)
    ├── MethodNotFoundError    a handle called a method the deployment lacks (an AttributeError)
    ├── DeployError            a deploy failed (constructor or lifespan startup raised);
    │                          also a RuntimeError, as Ray Serve's deploy failures are
    ├── BackPressureError      the caller-side queue is full (HTTP: 503 + Retry-After)
    ├── ReplicaUnavailableError  no replica could take the request (HTTP: 503)
    │   ├── RequestLostError   the replica was lost while it had the request, which may
    │   │                      have run (HTTP: 502); on Ray also ray's RayActorError
    │   │                      (backends/ray/errors.py), as Ray Serve raises
    │   └── EngineStopped      (app_toolkit.llm) a model's engine stopped under the
    │                          request: its replica ends, or the engine died
    ├── RequestTimeoutError    ``result(timeout_s=...)`` ran out
    └── DeploymentCallError    a deployment method raised an exception that could not
                               be sent back as itself (not picklable)

    starlette's HTTPException
    └── APIKeyRefused          ``admit_key`` refused a request: 401 (no such key) or 429
                               (over its limits), with the front's body and headers

Every exception keeps its arguments through pickling so it survives crossing processes.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.exceptions import HTTPException


class AppToolkitError(Exception):
    """Base class of every error this package raises on purpose."""


#: Ray Serve's base exception: a program that catches it catches every error the toolkit
#: raises on purpose.
RayServeException = AppToolkitError


class ConfigError(AppToolkitError, ValueError):
    """An option, import path or route prefix is invalid; the message says how to fix it."""


class BuilderArgsError(ConfigError):
    """Arguments for an application builder that it cannot take: the import path names no
    builder, a key is not a field of the builder's model, or a value does not validate.
    The message names the key or field and the fix."""


class MethodNotFoundError(AppToolkitError, AttributeError):
    """A handle called a method the deployment does not have (the message lists those it
    has, as Ray Serve's does)."""


class DefinitionError(ConfigError, TypeError):
    """A decorator was applied to something it cannot take (``@batch`` on a sync function,
    ``@multiplexed`` on a class); a ``TypeError`` too, as in Ray Serve."""


class DeployError(AppToolkitError, RuntimeError):
    """An application failed to deploy; the message carries the replica's error.

    A ``RuntimeError`` too, so ``except RuntimeError`` written for Ray Serve catches it.
    """


class BackPressureError(AppToolkitError):
    """The caller-side queue of a deployment is full.

    Over HTTP this becomes ``503 Service Unavailable`` with a ``Retry-After`` header, or
    what the deployment's ``backpressure_config`` says (``status_code``, ``retry_after_s``).
    """

    def __init__(
        self,
        deployment: str = "",
        max_queued_requests: int = 0,
        status_code: int = 503,
        retry_after_s: float | None = 1.0,
    ) -> None:
        super().__init__(deployment, max_queued_requests, status_code, retry_after_s)
        self.deployment = deployment
        self.max_queued_requests = max_queued_requests
        self.status_code = status_code
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return (
            f"Deployment {self.deployment!r} has {self.max_queued_requests} requests "
            "queued already (max_queued_requests); retry later or raise the limit."
        )


class ReplicaUnavailableError(AppToolkitError):
    """The replica serving a request went away before answering."""


class RequestLostError(ReplicaUnavailableError):
    """The replica went away while it had the request, so the request may have run (in
    part or whole). Repeat it only if that is safe; the proxy answers 502 without
    ``Retry-After``. (Requests that never reached a replica raise the parent class.)"""


class ContinuationRefused(RequestLostError):
    """A replica asked to continue a stream whose replica was lost cannot (a
    ``@continuable`` method's ``continue_from`` raises it, or the method): the stream ends
    with it, as it would have ended with the loss, and is not sent on again."""


class RequestTimeoutError(AppToolkitError, TimeoutError):
    """A handle call did not finish within its ``timeout_s``."""


class DeploymentCallError(AppToolkitError):
    """A deployment method raised an exception that could not be pickled back.

    The original type name and message are kept in ``args``.
    """

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(type_name, message)
        self.type_name = type_name
        self.message = message

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}"


class APIKeyRefused(HTTPException):
    """:func:`app_toolkit.admit_key` refused the request: ``status_code`` 401 (no key of that
    name, or it expired) or 429 (over the key's limits), ``headers`` the front's
    (``WWW-Authenticate``; ``Retry-After`` and ``x-ratelimit-*``), ``error`` the body's
    OpenAI-shaped error (``{"message", "type", "param", "code"}``) and ``detail`` its
    message. An ``HTTPException``: raised in a route or dependency, FastAPI answers it
    with its status and headers (``app_toolkit.llm``'s error handlers: in OpenAI's shape,
    as the front answers)."""

    def __init__(self, status_code: int, error: Mapping[str, object], headers: Mapping[str, str]) -> None:
        super().__init__(status_code, str(error.get("message", "")), dict(headers))
        self.error = dict(error)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.status_code, self.error, self.headers or {}))
