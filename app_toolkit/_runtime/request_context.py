"""Per-request context that crosses from the replica into user code, set in one place
(:func:`request_scope`) on every path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field

from app_toolkit._runtime import request_keys, request_values, tracing
from app_toolkit._runtime.drain_signal import DrainSignal
from app_toolkit._runtime.request_values import ModelSource, RequestValues, Share
from app_toolkit.deployment_id import DeploymentID
from app_toolkit.replica_id import ReplicaID

#: The user-class instance of the replica serving this request (for ``@ingress`` classes).
replica_instance: ContextVar[object] = ContextVar("app_toolkit_replica_instance", default=None)

#: The application the current replica belongs to (for handles to its sibling deployments).
app_name: ContextVar[str] = ContextVar("app_toolkit_app_name", default="")

_current = request_values.CURRENT


def current_request_id() -> str:
    """The id of the request being served ("" outside one); downstream handle calls
    carry it on."""
    values = _current.get()
    return values.request_id if values is not None else ""


def route_template(scope: Mapping[str, object]) -> str:
    """The path template of the route the app matched, as its routing recorded it in the
    scope ("" if none): what metrics, logs and spans name a request by."""
    path = getattr(scope.get("route"), "path", "")
    return path if isinstance(path, str) else ""


def current_share() -> Share | None:
    """The API key's share of the request being served (None: it came without a key, or
    outside a request); handle calls made for it carry it on."""
    values = _current.get()
    return values.share if values is not None else None


def current_model_id() -> str:
    """The multiplexed model the current request asks for ("" if none)."""
    values = _current.get()
    source = values.model if values is not None else ""
    return source if isinstance(source, str) else request_keys.model_id_in(source)


def serve_batch(model: str) -> None:
    """From here on in this task (and those it starts), the code serves a batch of
    requests that ask for ``model``: no one request's id or span (the context the batch's
    task was made in may hold whichever request started the batcher)."""
    _current.set(RequestValues("", None, model))


#: Tells the controller which multiplexed models a replica holds now.
ReportModels = Callable[[tuple[str, ...]], None]

#: Tells the controller which multiplexed models the current replica holds (set by the
#: replica while it serves; None outside replicas).
report_models: ContextVar[ReportModels | None] = ContextVar("app_toolkit_report_models", default=None)

#: The serving replica's drain, which its open streams and WebSockets watch (None outside
#: replicas).
drain_signal: ContextVar[DrainSignal | None] = ContextVar("app_toolkit_drain_signal", default=None)

#: What runs when the serving replica stops, after its last request and lifespan shutdown
#: (a model cache releasing its models): user-facing helpers add to it. None outside replicas.
StopHook = Callable[[], Awaitable[None]]
stop_hooks: ContextVar[list[StopHook] | None] = ContextVar("app_toolkit_stop_hooks", default=None)


@dataclass(frozen=True, slots=True)
class ReplicaRank:
    """A replica's place among its deployment's replicas (Ray Serve's ``ReplicaRank``):
    ``rank`` among all of them (0 to world_size - 1), ``node_rank`` of its node among the
    nodes they run on, ``local_rank`` among those on its node. Replicas of one version
    have distinct ranks; during an upgrade a new replica may share its rank with the old
    one it replaces (docs/deployments.md)."""

    rank: int
    node_rank: int
    local_rank: int


@dataclass(frozen=True, slots=True)
class ReplicaContext:
    """Which replica is running the current code (Ray Serve's ``ReplicaContext``), and
    its place among its deployment's replicas (``rank``; None on a replica whose
    controller did not assign one) out of ``world_size`` (the replicas the deployment was
    set to run when it started).

    ``replica_id`` is a :class:`ReplicaID`: the id string, with Ray Serve's ``unique_id``
    and ``deployment_id`` (a plain string given here is made one). ``servable_object`` is
    the user's instance (its function, for a function deployment); None while its
    constructor runs, as in Ray Serve. ``code_version`` is the version of the code it
    runs. ``gang_context`` is always None: gang scheduling is not supported, and Ray Serve
    gives None to a replica outside a gang.
    """

    app_name: str
    deployment: str
    replica_id: ReplicaID
    rank: ReplicaRank | None = None
    world_size: int = 0
    servable_object: object = field(default=None, compare=False, repr=False)  # the user's object
    code_version: str | None = None
    gang_context: None = None

    def __post_init__(self) -> None:
        if not isinstance(self.replica_id, ReplicaID):
            replica_id = ReplicaID(self.replica_id, DeploymentID(self.app_name, self.deployment))
            object.__setattr__(self, "replica_id", replica_id)  # frozen: set once, here

    @property
    def replica_tag(self) -> str:
        """The replica's ``unique_id`` (Ray Serve 2.60 has both names)."""
        return self.replica_id.unique_id


#: The replica running the current code (None outside replicas).
replica: ContextVar[ReplicaContext | None] = ContextVar("app_toolkit_replica", default=None)


def enter_replica(context: ReplicaContext) -> None:
    """Mark the current task as running in ``context``'s replica."""
    app_name.set(context.app_name)
    replica.set(context)


@dataclass(frozen=True, slots=True)
class Serving:
    """What a replica gives every request it serves (made once, when it has started)."""

    replica: ReplicaContext
    instance: object  # the user's object: an @ingress route's ``self``
    report_models: ReportModels | None
    drain_signal: DrainSignal
    stop_hooks: list[StopHook]


#: The replica values the current task already holds (see :func:`enter_serving`).
_inherited: ContextVar[Serving | None] = ContextVar("app_toolkit_serving", default=None)


#: The tokens of :func:`_set_serving`, one per context variable, in its order.
_ServingTokens = tuple[
    Token[str],
    Token[ReplicaContext | None],
    Token[object],
    Token[ReportModels | None],
    Token[DrainSignal | None],
    Token[list[StopHook] | None],
]


def _set_serving(serving: Serving) -> _ServingTokens:
    # Spelled out (here and in _reset_serving), not looped: every handle call and every
    # proxied request enters this.
    return (
        app_name.set(serving.replica.app_name),
        replica.set(serving.replica),
        replica_instance.set(serving.instance),
        report_models.set(serving.report_models),
        drain_signal.set(serving.drain_signal),
        stop_hooks.set(serving.stop_hooks),
    )


def _reset_serving(tokens: _ServingTokens) -> None:
    """Undo :func:`_set_serving` (its tokens, in its order)."""
    stop_hooks.reset(tokens[5])
    drain_signal.reset(tokens[4])
    report_models.reset(tokens[3])
    replica_instance.reset(tokens[2])
    replica.reset(tokens[1])
    app_name.reset(tokens[0])


def enter_serving(serving: Serving) -> None:
    """Give the current task, and the tasks it starts, every value ``serving`` gives a
    request: an ingress replica's own HTTP server (direct ingress) starts from here, so
    its requests need only their own values set (:func:`request_scope`)."""
    _set_serving(serving)
    _inherited.set(serving)


def request_scope(
    request_id: str,
    trace: tracing.TraceContext | tracing.LazyTrace | None = None,
    serving: Serving | None = None,
    model: ModelSource = "",
    share: Share | None = None,
) -> AbstractContextManager[None]:
    """Run the code inside as request ``request_id``: its id (log records, downstream
    calls), its span ``trace`` (None: the enclosing request's, if any), and in a replica
    (``serving``) the replica, its instance, its drain signal, the request's multiplexed
    ``model`` and its API key's ``share`` (outside one: the enclosing request's). All of
    it is reset on the way out."""
    return _RequestScope(RequestValues(request_id, trace, model, share), serving)


class _RequestScope(AbstractContextManager[None]):
    # A class, not a generator: it is entered for every request, twice on some paths. The
    # request's own values are one object in one context variable (request_values.py).
    __slots__ = ("_values", "_serving", "_token", "_serving_tokens")

    def __init__(self, values: RequestValues, serving: Serving | None) -> None:
        self._values = values
        self._serving = serving
        self._token: Token[RequestValues | None] | None = None
        self._serving_tokens: _ServingTokens | None = None  # None: the task had them already

    def __enter__(self) -> None:  # once: request_scope() makes one per use
        values, serving = self._values, self._serving
        outer = _current.get()
        if outer is not None:  # what this scope does not say stays the enclosing request's
            if values.trace is None:
                values.trace = outer.trace
            if serving is None:
                values.model = outer.model
                if values.share is None:
                    values.share = outer.share
        if serving is not None and _inherited.get() is not serving:  # else they are there already
            self._serving_tokens = _set_serving(serving)
        self._token = _current.set(values)

    def __exit__(self, *exc_info: object) -> None:
        leave, self._values.leave = self._values.leave, None
        try:
            if leave is not None:  # (the concurrent slot of the key an open route let it in as)
                leave()
        finally:
            if self._token is not None:
                _current.reset(self._token)
            if self._serving_tokens is not None:
                _reset_serving(self._serving_tokens)
