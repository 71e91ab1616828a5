"""How the soak judges each request: a record of what happened to it, the kills made
during the run, and the documented rules (docs/fault-tolerance.md, docs/http.md,
docs/streaming.md) that may explain a request that did not complete intact. A failure
no rule explains is *unexplained*, and the soak fails. Pure: no Ray, no sockets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from benchmarks.percentile import percentile

#: A request that started this soon after a kill returned may still have met it (a new
#: connection queued in a dying proxy's accept backlog, a table not updated yet).
AFTER_KILL_S = 0.2
#: A resumable stream's cut is a kill's doing if it came this soon after the kill ended.
CUT_AFTER_KILL_S = 5.0

#: Which application serves each kind of traffic (the kills of its replicas concern it).
APP_OF = {
    "http": "soak",
    "upload": "soak",
    "sse": "soak",
    "resumable": "soak",
    "websocket": "soak",
    "handle": "soakh",
    "chat": "llm",
    "smol": "llm",
    "completion": "llm",
    "models": "llm",
}
#: The LLM app's models (``soak_apps``), by the kind of traffic that asks them.
MODEL_OF = {"chat": "echo", "completion": "echo", "smol": "smollm2"}


def model_deployment(model: str) -> str:
    """build_openai_app's name for the deployment of ``model`` (an id of letters, digits,
    "-" and "_", with no ``deployment_config.name``: ``LLMConfig.deployment_name``)."""
    return f"LLMServer-{model}"


#: LLM replies, which go on on another replica when theirs is lost (docs/llm.md, "Replies
#: that outlive their replica"): a model replica's kill explains none of their failures.
CONTINUED = frozenset({"chat", "smol", "completion"})
#: Traffic that reaches the cluster through a node's proxy (a handle call does not).
THROUGH_PROXY = frozenset(APP_OF) - {"handle"}

#: What happened to a request:
#: intact      completed, and everything in it checked (bytes, events, words);
#: status      an HTTP status other than the expected (``status``), or a handle's
#:             RequestLostError (502) / ReplicaUnavailableError or BackPressureError (503);
#: closed      the connection closed early (a cut stream, a WebSocket closed by the server);
#: reset       the connection was reset;
#: refused     no server accepted the connection;
#: error-event an OpenAI stream ended with its error event;
#: store-lost  a resumable reply the store no longer has (404 on resuming);
#: abandoned   a resumable reply whose writer stopped (the stream ended without its end);
#: corrupt     data lost, repeated, reordered or wrong inside what claimed to be whole;
#: timeout     no answer in time (a hang);
#: error       anything else (a client-side exception).
OUTCOMES = (
    "intact",
    "status",
    "closed",
    "reset",
    "refused",
    "error-event",
    "store-lost",
    "abandoned",
    "corrupt",
    "timeout",
    "error",
)


@dataclass
class Record:
    """One request (an HTTP exchange, a stream with its resumptions, a WebSocket session
    or a handle call), with monotonic times."""

    kind: str
    start: float
    end: float = 0.0
    outcome: str = "intact"
    status: int = 0
    detail: str = ""
    proxy_node: str = ""  # the node whose proxy accepted its connection, "" if unknown
    node: str = ""  # the node of the replica that answered, "" if unknown
    replica: str = ""  # the replica that answered, "" if unknown
    writer: str = ""  # resumable: the replica that writes the reply
    writer_node: str = ""
    head: bool = False  # the response's head (or the WebSocket's handshake) had come
    cuts: list[float] = field(default_factory=list)  # resumable: when its stream was cut and resumed
    #: resumable: the node whose proxy held the connection each cut ended ("" if unknown);
    #: ``proxy_node`` is the last connection's, which a resumption changes.
    cut_proxies: list[str] = field(default_factory=list)
    #: a streamed LLM reply: the longest wait for one of its pieces, the first from the
    #: request on (a continuation's stall, where its model replica was lost), seconds
    stall_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Kill:
    """A kill as it was made: monotonic times around it, and whom it hit."""

    kind: str  # soak_schedule.KINDS
    started: float
    ended: float
    target: str  # a replica id, a node id, "controller" or "redis"
    node: str = ""  # the node the target ran on ("" for Redis)
    app: str = ""  # a replica kill: its application
    deployment: str = ""  # a replica kill: its deployment
    recovered: float = 0.0  # when what it killed served again (a replacement, a restart)

    @property
    def back(self) -> float:
        return max(self.recovered, self.ended)


def in_flight(record: Record, kill: Kill) -> bool:
    return kill.started <= record.end and record.start <= kill.ended + AFTER_KILL_S


def while_down(record: Record, kill: Kill) -> bool:
    """The request met the time between the kill and the killed part's return."""
    return kill.started <= record.end and record.start <= kill.back + AFTER_KILL_S


def _replica_lost(record: Record, kill: Kill) -> bool:
    """The kill took a replica (or a node's replicas) that may have had this request."""
    if kill.kind == "node":
        return record.node in ("", kill.node) or record.proxy_node == kill.node
    if kill.kind not in ("ingress", "model") or kill.app != APP_OF[record.kind]:
        return False
    if kill.kind == "model":
        # Which model replica a relayed call reached is not known to the client; an LLM
        # reply goes on on another.
        return record.kind not in CONTINUED
    return record.replica in ("", kill.target)


def _proxy_lost(record: Record, kill: Kill, proxy_node: str | None = None) -> bool:
    """The kill took the proxy that accepted this request's connection (``proxy_node``'s:
    by default the record's last)."""
    if record.kind not in THROUGH_PROXY or kill.kind not in ("proxy", "node"):
        return False
    return (record.proxy_node if proxy_node is None else proxy_node) in ("", kill.node)


Rule = Callable[[Record, Kill], bool]

#: The documented rules, each named by what it says; the first that holds names the cause.
#: Each holds for a request in flight at the kill, but for a refused connection and a 503
#: for want of replicas: those only need to meet the time until the killed part was back.
#: No rule explains an LLM reply's error event: one whose model replica was lost goes on.
RULES: tuple[tuple[str, Rule], ...] = (
    (
        "502: in flight on a killed replica (it may have run)",
        lambda r, k: in_flight(r, k) and r.outcome == "status" and r.status == 502 and _replica_lost(r, k),
    ),
    (
        "503: read but not run by a killed replica, or none reachable",
        lambda r, k: in_flight(r, k) and r.outcome == "status" and r.status == 503 and _replica_lost(r, k),
    ),
    (
        "503: no replica reachable while a lost node's replicas were replaced",
        lambda r, k: r.outcome == "status" and r.status == 503 and k.kind == "node",
    ),
    (
        "closed mid-response: its replica was killed (a stream is cut, a WebSocket closed)",
        lambda r, k: in_flight(r, k) and r.outcome == "closed" and r.head and _replica_lost(r, k),
    ),
    (
        "connection closed: its proxy was killed",
        lambda r, k: in_flight(r, k) and r.outcome in ("closed", "reset") and _proxy_lost(r, k),
    ),
    (
        "refused: a proxy was down (killed, restarting)",
        lambda r, k: r.outcome == "refused" and r.kind in THROUGH_PROXY and k.kind in ("proxy", "node"),
    ),
    (
        "resumable reply lost with Redis (restarted without persistence)",
        lambda r, k: (
            in_flight(r, k)
            and (
                r.kind == "resumable"
                and k.kind == "redis"
                and r.outcome in ("store-lost", "status", "closed", "abandoned")
            )
        ),
    ),
    (
        "resumable reply abandoned: its writer's replica was killed (a cut, then 410 on resuming)",
        lambda r, k: (
            in_flight(r, k)
            and (
                r.kind == "resumable"
                and r.outcome in ("abandoned", "store-lost", "closed")
                and (
                    (k.kind == "ingress" and k.target == r.writer)
                    or (k.kind == "node" and k.node in (r.writer_node, ""))
                )
            )
        ),
    ),
)
UNEXPLAINED = "UNEXPLAINED"
INTACT = "intact"


def _cut_explained(record: Record, at: float, proxy_node: str, kills: Iterable[Kill]) -> bool:
    """A resumable stream's cut that its client resumed: a kill of what carried it (a
    replica of its application, which may have been its reader's or its writer's; its
    node; the proxy of the connection it cut; the store)."""
    return any(
        kill.started <= at <= kill.ended + CUT_AFTER_KILL_S
        and (
            kill.kind in ("redis", "node")
            or (kill.kind == "ingress" and kill.app == APP_OF[record.kind])
            or _proxy_lost(record, kill, proxy_node)
        )
        for kill in kills
    )


#: The streamed LLM replies whose stalls are reported, by their model's engine.
STREAMED_REPLIES = {"chat": "echo", "smol": "transformers (SmolLM2)"}


def stalls(records: list[Record], kills: list[Kill]) -> dict[str, dict[str, float]]:
    """Per engine, the longest stall of each intact streamed reply (seconds): p50, p99 and
    the longest over those a kill of one of their model's replicas met (``met_*``: a
    continuation's stall where the replica was theirs; about half of them, with two
    replicas), and p50, p99 over those no kill met."""
    table = {}
    for kind, engine in STREAMED_REPLIES.items():
        deployment = model_deployment(MODEL_OF[kind])
        model_kills = [k for k in kills if k.kind == "model" and k.deployment == deployment]
        intact = [r for r in records if r.kind == kind and r.outcome == "intact"]
        met = [r.stall_s for r in intact if any(in_flight(r, kill) for kill in model_kills)]
        calm = [r.stall_s for r in intact if not any(in_flight(r, kill) for kill in kills)]
        table[engine] = {
            "met_replies": len(met),
            "met_p50_s": round(percentile(met, 0.5), 3),
            "met_p99_s": round(percentile(met, 0.99), 3),
            "met_max_s": round(max(met, default=0.0), 3),
            "calm_replies": len(calm),
            "calm_p50_s": round(percentile(calm, 0.5), 3),
            "calm_p99_s": round(percentile(calm, 0.99), 3),
        }
    return table


def classify(record: Record, kills: Iterable[Kill]) -> str:
    """``intact``, the name of the rule that explains the failure, or ``UNEXPLAINED``."""
    if record.outcome == INTACT:
        proxies = record.cut_proxies or [record.proxy_node] * len(record.cuts)  # older reports
        cuts = zip(record.cuts, proxies, strict=True)
        return INTACT if all(_cut_explained(record, at, node, kills) for at, node in cuts) else UNEXPLAINED
    kills = [kill for kill in kills if while_down(record, kill)]
    for name, holds in RULES:
        if any(holds(record, kill) for kill in kills):
            return name
    return UNEXPLAINED


@dataclass
class Verdict:
    """The whole run, judged."""

    per_kind: dict[str, Counter[str]]  # traffic kind -> outcome -> count
    per_rule: Counter[str]
    unexplained: list[Record]
    calm: int  # requests not in flight at any kill
    calm_intact: int
    resets_while_proxy_lived: list[Record]
    corrupt: list[Record]

    @property
    def calm_intact_share(self) -> float:
        return self.calm_intact / self.calm if self.calm else 1.0

    def passed(self, share: float = 0.95) -> bool:
        return (
            not self.unexplained
            and not self.resets_while_proxy_lived
            and not self.corrupt
            and self.calm_intact_share >= share
        )


def judge(records: Iterable[Record], kills: list[Kill]) -> Verdict:
    per_kind: dict[str, Counter[str]] = {}
    per_rule: Counter[str] = Counter()
    unexplained: list[Record] = []
    resets: list[Record] = []
    corrupt: list[Record] = []
    calm = calm_intact = 0
    for record in records:
        per_kind.setdefault(record.kind, Counter())[record.outcome] += 1
        verdict = classify(record, kills)
        if verdict not in (INTACT, UNEXPLAINED):
            per_rule[verdict] += 1
        if verdict == UNEXPLAINED:
            unexplained.append(record)
        if record.outcome == "corrupt":
            corrupt.append(record)
        touched = [kill for kill in kills if in_flight(record, kill)]
        dropped = record.outcome in ("reset", "refused") or (record.outcome == "closed" and not record.head)
        if dropped and not any(_proxy_lost(record, kill) for kill in kills if while_down(record, kill)):
            resets.append(record)
        if not touched:
            calm += 1
            calm_intact += verdict == INTACT
    return Verdict(per_kind, per_rule, unexplained, calm, calm_intact, resets, corrupt)
