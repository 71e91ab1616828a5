"""Typed messages passed between controller, proxy, handles and replicas."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app_toolkit._runtime.compact import compact
from app_toolkit._runtime.request_values import API_KEY_SHARE, Share
from app_toolkit.config import AutoscalingPolicy, DeploymentConfig
from app_toolkit.deployment_id import DeploymentID as DeploymentID  # the runtime's name for it too

if TYPE_CHECKING:
    from starlette.types import Message, Scope

Headers = list[tuple[bytes, bytes]]

# WebSocket close codes the proxy and replicas send (RFC 6455 §7.4).
CLOSE_POLICY = 1008  # no application at this path
CLOSE_INTERNAL_ERROR = 1011  # the app failed, or its replica was lost
CLOSE_SERVICE_RESTART = 1012  # the replica drains: reconnect (to another one)
#: The reason sent with CLOSE_SERVICE_RESTART.
RESTART_REASON = "server restarting; reconnect"
CLOSE_TRY_AGAIN_LATER = 1013  # overloaded


@compact
@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """What a caller needs to reach one running replica."""

    replica_id: str
    deployment: DeploymentID
    host: str
    port: int
    token: bytes
    max_ongoing_requests: int
    node_id: str = ""  # the Ray node it runs on ("" on the local backend)
    models: tuple[str, ...] = ()  # multiplexed models it holds, as it last reported them
    tls: bool = False  # it takes connections over TLS only (_runtime/channel/tls.py)
    #: Its place among the deployment's replicas (0, 1, ...): a replacement takes the rank
    #: of the replica it replaces, so shard keys follow ranks (routing/choice.py).
    rank: int = -1
    #: The abstract name of its hand-off socket ("": it takes no client connections): the node's
    #: proxy passes it connections to serve itself (direct ingress, _runtime/handoff.py).
    handoff: str = ""
    #: The name of its Ray actor ("" on the local backend): the replica's own, or that of
    #: the spare process it started in (backends/ray/spares.py).
    actor: str = ""
    #: Its newest routing stats (its ``record_routing_stats()``) as JSON, as it last
    #: reported them ("": none yet); request routers read them (``RunningReplica``).
    routing_stats: str = ""

    def stats(self) -> dict[str, Any]:
        """Its newest routing stats, read (empty: none yet)."""
        return dict(json.loads(self.routing_stats)) if self.routing_stats else {}


#: A ``CORSMiddleware``'s keyword arguments, sorted by name.
CORSOptions = tuple[tuple[str, object], ...]


@compact
@dataclass(frozen=True, slots=True)
class PathRoute:
    """One route of an app, as the proxy matches it (in the app's own route order).

    Only apps with per-route pools, deadlines or open routes have these; every other
    request of an app goes to its ingress.
    """

    pattern: str  # regular expression over the path below the app's route_prefix
    methods: frozenset[str] | None  # HTTP methods; None matches any (mounts, WebSockets)
    scope_types: frozenset[str]  # "http", "websocket" or both (mounts)
    deployment: str | None  # the deployment serving it; None for the ingress
    deadline_s: float | None = None
    keyless: bool = False  # served without an API key (``@open_route``)


@compact
@dataclass(frozen=True, slots=True)
class AdoptedReplica:
    """A running replica as a restarted controller finds it."""

    info: ReplicaInfo
    code_version: str
    config: DeploymentConfig
    handle: object  # the backend's handle (an actor); None until the backend fills it in
    node_rank: int = -1  # its ReplicaRank's other two places (info.rank is the first)
    local_rank: int = -1


@compact
@dataclass(frozen=True, slots=True)
class RouteInfo:
    """One HTTP route prefix, the ingress deployment behind it and its special routes."""

    route_prefix: str
    app: str
    ingress: DeploymentID
    routes: tuple[PathRoute, ...] = ()
    #: Its requests get access lines (its ingress's ``logging_config.enable_access_log``).
    access_log: bool = True
    #: The keyword arguments of the app's ``CORSMiddleware``, if it has one: with API keys
    #: on, the front answers CORS preflights with them (a browser sends no key with one).
    cors: CORSOptions | None = None


#: Bytes of a stream's items its caller keeps by default (``@continuable(max_bytes=)``).
CONTINUATION_MAX_BYTES = 16 << 20


@compact
@dataclass(frozen=True, slots=True)
class StreamContinuation:
    """A deployment's generator method whose streams its callers continue on another
    replica when theirs is lost (``@continuable``: app_toolkit/continuable.py), and its
    rules: continuations per stream, items a caller keeps, seconds a continuation waits,
    and the bytes of items a caller keeps (their size as they crossed the channel)."""

    method: str
    limit: int
    max_items: int
    wait_s: float
    max_bytes: int = CONTINUATION_MAX_BYTES


@compact
@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    """The desired state of one deployment, as the controller stores it.

    ``definition`` and ``init_args`` are serialized by the backend so the controller never
    imports user code.
    """

    id: DeploymentID
    definition: bytes
    init_args: bytes
    config: DeploymentConfig
    is_asgi: bool
    code_version: str
    #: It is the ingress of an application served over HTTP (it has a route prefix): on
    #: Ray its replicas take client connections from their node's proxy (direct ingress).
    http_ingress: bool = False
    #: Deployed by ``app-toolkit run --reload``: the replicas of older versions it replaces
    #: end their streams as their drain starts, not at its deadline (a fast reload).
    reloaded: bool = False
    #: The digest of the user's source files its code depends on ("" if none), part of
    #: ``code_version`` (app_toolkit/code_sources.py).
    sources: str = ""
    #: Its continuable generator methods (read from its class where the app is built).
    continuations: tuple[StreamContinuation, ...] = ()


@compact
@dataclass(frozen=True, slots=True)
class ByValue:
    """Code to serialize with its module's source rather than by reference (an autoscaling
    policy: the controller, which runs it, does not import the application's modules)."""

    value: object


@compact
@dataclass(frozen=True, slots=True)
class AppSpec:
    """The desired state of one application."""

    name: str
    route_prefix: str | None
    ingress: str
    deployments: tuple[DeploymentSpec, ...]
    routes: tuple[PathRoute, ...] = ()  # see RouteInfo
    paths: tuple[str, ...] = ()  # every route's path template, to find clashes between apps
    #: An application-level autoscaling policy (its function serialized, build.py).
    autoscaling_policy: AutoscalingPolicy | None = None
    cors: CORSOptions | None = None  # see RouteInfo

    def deployment(self, name: str) -> DeploymentSpec:
        for spec in self.deployments:
            if spec.id.name == name:
                return spec
        raise KeyError(name)


# ---------------------------------------------------------------------------- data plane
#
# A caller sends one Request; the replica answers with Answers, in order: a terminal one
# (a complete response, a result, a failure, a refusal), or a head or items that a
# StreamEnd closes. How they travel (the channel's frames, or a call in this process) is
# the transport's business: only ``channel/`` knows the wire's kinds.


@compact
@dataclass(frozen=True, slots=True)
class HTTPRequest:
    """An HTTP request as the proxy forwards it: the ASGI scope and the body, whole, or
    (``more_body``) its start, the rest following as :class:`RequestBodyPiece` messages
    once the replica admitted the request (its first flow-control credit says so)."""

    request_id: str
    scope: Scope
    body: bytes
    more_body: bool = False
    trace: str = ""  # the span the replica's span continues, as a traceparent (not in the scope)
    tracestate: str = ""


@compact
@dataclass(frozen=True, slots=True)
class RequestBodyPiece:
    """The next piece of a request body the proxy streams to the replica; ``more``:
    others follow."""

    data: bytes
    more: bool


@compact
@dataclass(frozen=True, slots=True)
class WebSocketOpen:
    """A WebSocket connection as the proxy forwards it: its ASGI scope. The client's
    messages follow as :class:`WebSocketMessage`."""

    request_id: str
    scope: Scope
    trace: str = ""  # as HTTPRequest's
    tracestate: str = ""


@compact
@dataclass(frozen=True, slots=True)
class MethodCall:
    """A handle call: method name and arguments."""

    request_id: str
    method: str
    args: tuple[object, ...]
    kwargs: dict[str, object] = field(default_factory=dict)
    stream: bool = False  # the method is a generator: answer with StreamItems, then StreamEnd
    model_id: str = ""  # handle.options(multiplexed_model_id=...): routes to its holders
    shard_key: str = ""  # handle.options(shard_key=...): routes to the key's replica
    trace: str = ""  # the caller's span as a traceparent ("" outside a traced request)
    tracestate: str = ""
    #: One of a handle.broadcast()'s calls: the replica admits it even when it is full.
    broadcast: bool = False
    #: The API key's share of the request the call was made for (None: no key).
    share: Share | None = None
    #: A continuable stream's call sent again after its replica was lost: the items its
    #: caller received (the method's ``continue_from`` makes the request for the rest).
    continued: tuple[object, ...] | None = None


#: What a caller sends to open a request.
Request = HTTPRequest | WebSocketOpen | MethodCall


def beyond_limit(request: Request) -> bool:
    """A replica admits the request beyond ``max_ongoing_requests`` (a broadcast's call)."""
    return isinstance(request, MethodCall) and request.broadcast


def share_of(request: Request) -> Share | None:
    """The API key's share the request carries (None: no key): a handle call's own, an
    HTTP request's or WebSocket's as the front put it in the scope."""
    if isinstance(request, MethodCall):
        return request.share
    share = request.scope.get(API_KEY_SHARE)
    return share if isinstance(share, Share) else None


def body_follows(request: Request | None) -> bool:
    """The request's body comes after it, in pieces (its replica must admit it first)."""
    return isinstance(request, HTTPRequest) and request.more_body


@compact
@dataclass(frozen=True, slots=True)
class HTTPResponse:
    """A complete (non-streamed) HTTP response: one answer."""

    status: int
    headers: Headers
    body: bytes
    route: str = ""  # the app's path template that served it ("" if none matched)


@compact
@dataclass(frozen=True, slots=True)
class HTTPResponseStart:
    """The head of a streamed response; :class:`BodyChunk` answers and a StreamEnd follow."""

    status: int
    headers: Headers
    route: str = ""  # the app's path template that served it ("" if none matched)


@compact
@dataclass(frozen=True, slots=True)
class BodyChunk:
    """One chunk of a streamed HTTP response body, as the app sent it."""

    data: bytes


@compact
@dataclass(frozen=True, slots=True)
class CallResult:
    """What a (non-streamed) deployment method returned."""

    value: object


@compact
@dataclass(frozen=True, slots=True)
class StreamItem:
    """One item a generator method yielded."""

    value: object


@compact
@dataclass(frozen=True, slots=True)
class WebSocketMessage:
    """One ASGI message of a WebSocket: the client's (to the replica) or the app's (back)."""

    message: Message


#: What a caller sends on a request it opened: the client's WebSocket messages, or the
#: rest of a streamed request body.
ClientMessage = WebSocketMessage | RequestBodyPiece


@compact
@dataclass(frozen=True, slots=True)
class StreamEnd:
    """Nothing more comes for this request: the end of a streamed response, of a stream
    of items, or of a WebSocket."""


@compact
@dataclass(frozen=True, slots=True)
class CallFailure:
    """A deployment method raised; ``exception`` is the pickled original when possible."""

    type_name: str
    message: str
    exception: bytes | None

    @classmethod
    def type_error(cls, message: str) -> CallFailure:
        """A call failed in transit (what was sent could not be decoded): a TypeError."""
        return cls("TypeError", message, pickle.dumps(TypeError(message)))


@compact
@dataclass(frozen=True, slots=True)
class Rejected:
    """The replica did not take the request, which never started. ``draining``: it is
    shutting down (send it nothing more); else it is busy (try it again after a back-off)."""

    draining: bool = False


@compact
@dataclass(frozen=True, slots=True)
class ReplicaLost:
    """Never sent by a replica: its caller's transport says the connection dropped while
    the request was in flight (it may have run)."""


#: What a replica sends back for a request, in order (see the module's note above).
Answer = (
    HTTPResponse
    | HTTPResponseStart
    | BodyChunk
    | CallResult
    | StreamItem
    | WebSocketMessage
    | StreamEnd
    | CallFailure
    | Rejected
    | ReplicaLost
)

#: After one of these, nothing more comes back for a request.
TERMINAL = (HTTPResponse, CallResult, StreamEnd, CallFailure, Rejected, ReplicaLost)
#: The answers (and client WebSocket messages) that stream: flow control counts them.
STREAMED = (BodyChunk, StreamItem, WebSocketMessage)

END = StreamEnd()
LOST = ReplicaLost()
BUSY = Rejected(draining=False)
DRAINING = Rejected(draining=True)
