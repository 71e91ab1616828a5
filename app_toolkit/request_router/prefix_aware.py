"""Prefix-aware routing: a prompt goes where prompts that start like it went, so the
engine there finds their keys and values in its prefix cache (Ray Serve LLM's
``PrefixCacheAffinityRouter``, with Ray 2.60's rule).

Per request, while the replicas' loads are balanced (the most and fewest requests on
the replicas differ by at most ``imbalanced_threshold``, 10 by default where Ray 2.60's
is infinity): among the replicas whose KV cache is not near full, those whose routed
texts share the longest prefix with this one, if that prefix is at least
``match_rate_threshold`` of the text; else those holding the fewest characters; the
least loaded of them first. When the loads are imbalanced, or the request carries no
text: power of two choices on the loads. Where Ray's router then only retries those
replicas, a request whose chosen replicas are all full goes to another with a free slot
(power of two), so that it never waits while a replica idles.

A replica's load is the larger of this caller's requests in flight on it
(``queue_len``) and the requests its engine reported running and waiting
(``routing_stats["running"] + routing_stats["waiting"]``, as an ``app_toolkit.llm`` model
replica's ``record_routing_stats()`` gives them): the report sees every caller's requests
but is up to a period old, the caller's count is current but sees only its own; adding
them would count this caller's requests twice. A KV cache is near full when the replica
reported ``kv_cache_use`` (0 to 1) at or above ``kv_cache_full_threshold`` (0.95): its
engine would evict cached prefixes, or make new replies wait, to hold one more. Replicas
without stats are read as reporting nothing: the rule is Ray's.

The text is the request's ``messages`` (their contents joined) or ``prompt``: from a
handle call's first argument that has either (an attribute or a key), or from an HTTP
request's JSON body when it came whole with the head. Each caller keeps its own record of
the texts it routed (no shared actor, no call per request), bounded per replica by
``eviction_threshold_chars``, cut back to ``eviction_target_chars`` least recently used
first.
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Mapping
from typing import Any

from app_toolkit.request_router import PendingRequest, PowerOfTwoChoicesRequestRouter, RunningReplica
from app_toolkit.request_router.shared_prefix import shared_prefix

#: Most body bytes a router parses to find the text (a longer body is routed without it).
MAX_BODY_BYTES = 1 << 20


class PrefixCacheAffinityRouter(PowerOfTwoChoicesRequestRouter):
    """Ranks first the replicas that served the longest prefix of a request's text."""

    def __init__(self) -> None:
        super().__init__()
        self.initialize_state()

    def initialize_state(  # type: ignore[override]  # Ray's keyword arguments, checked
        self,
        imbalanced_threshold: float | None = 10,
        match_rate_threshold: float | None = 0.1,
        do_eviction: bool | None = False,
        eviction_threshold_chars: int | None = 400_000,
        eviction_target_chars: int | None = 360_000,
        eviction_interval_secs: float | None = 10,
        kv_cache_full_threshold: float | None = 0.95,
    ) -> None:
        """Ray's kwargs, and its defaults but one: ``imbalanced_threshold`` is 10 where Ray
        2.60's is infinity (its router then never falls back to power of two choices), so
        that a prefix many requests share cannot pile them onto one replica while others
        idle. ``do_eviction`` and ``eviction_interval_secs`` are taken with no effect: the
        record is always bounded, and cut back as it grows past the threshold, not on a
        timer. ``kv_cache_full_threshold`` is this toolkit's: the reported KV-cache use
        from which a replica is passed over (module docstring)."""
        self._imbalanced_threshold = math.inf if imbalanced_threshold is None else float(imbalanced_threshold)
        self._match_rate_threshold = 0.1 if match_rate_threshold is None else float(match_rate_threshold)
        threshold = 400_000 if eviction_threshold_chars is None else int(eviction_threshold_chars)
        target = threshold if eviction_target_chars is None else int(eviction_target_chars)
        self._kv_full = 0.95 if kv_cache_full_threshold is None else float(kv_cache_full_threshold)
        if not 0 <= self._match_rate_threshold <= 1:
            raise ValueError(f"match_rate_threshold must be within [0, 1], got {match_rate_threshold}")
        if not 0 < self._kv_full <= 1:
            raise ValueError(f"kv_cache_full_threshold must be within (0, 1], got {kv_cache_full_threshold}")
        if threshold < 1 or not 0 <= target <= threshold:
            raise ValueError(
                "eviction_threshold_chars must be >= 1 and eviction_target_chars within [0, it], got "
                f"{eviction_threshold_chars} and {eviction_target_chars}"
            )
        self._threshold, self._target = threshold, target
        self._texts: dict[str, collections.OrderedDict[str, None]] = {}  # replica -> texts, oldest first
        self._chars: dict[str, int] = {}

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        live = {replica.replica_id for replica in replicas}
        for gone in [replica_id for replica_id in self._texts if replica_id not in live]:
            self._forget(gone)
        for replica_id in live:
            self._texts.setdefault(replica_id, collections.OrderedDict())
            self._chars.setdefault(replica_id, 0)

    def on_replica_actor_died(self, replica_id: str) -> None:
        self._forget(replica_id)

    def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        loads = {replica.replica_id: self.load(replica) for replica in candidate_replicas}
        fallback = self._power_of_two(candidate_replicas, loads)
        text = request_text(pending_request) if pending_request is not None else None
        if not text or not candidate_replicas:
            return fallback
        if max(loads.values()) - min(loads.values()) > self._imbalanced_threshold:
            return fallback
        # A full KV cache is passed over; when every one is full, none is.
        roomy = [r for r in candidate_replicas if kv_cache_use(r) < self._kv_full] or candidate_replicas
        matched = {replica.replica_id: self._longest(replica.replica_id, text) for replica in roomy}
        longest = max(matched.values())
        if longest and longest / len(text) >= self._match_rate_threshold:
            best = [replica for replica in roomy if matched[replica.replica_id] == longest]
        else:
            fewest = min(self._chars.get(replica.replica_id, 0) for replica in roomy)
            best = [replica for replica in roomy if self._chars.get(replica.replica_id, 0) == fewest]
        return [*_by_load(best, loads), *fallback]

    def load(self, replica: RunningReplica) -> int:
        """The requests on ``replica`` as this caller knows them (module docstring): its
        own in flight, or its engine's report of running and waiting, the larger."""
        return max(self.queue_len(replica.replica_id), engine_load(replica))

    def _power_of_two(
        self, candidate_replicas: list[RunningReplica], loads: Mapping[str, int]
    ) -> list[list[RunningReplica]]:
        """Power of two choices, on ``loads``: the pair's less loaded replica ranks first."""
        ranks = super().choose_replicas(candidate_replicas)
        return [rank for pair in ranks for rank in _by_load(pair, loads)]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: str, result: Any = None) -> None:
        text = request_text(pending_request)
        if text:
            self._insert(replica_id, text)

    def _longest(self, replica_id: str, text: str) -> int:
        texts = self._texts.get(replica_id)
        if not texts:
            return 0
        return max(shared_prefix(held, text) for held in texts)

    def _insert(self, replica_id: str, text: str) -> None:
        texts = self._texts.setdefault(replica_id, collections.OrderedDict())
        chars = self._chars.get(replica_id, 0)
        if text in texts:
            texts.move_to_end(text)
            return
        for held in [held for held in texts if text.startswith(held)]:
            del texts[held]  # the new text holds it (a conversation's next turn)
            chars -= len(held)
        if any(held.startswith(text) for held in texts):
            self._chars[replica_id] = chars
            return  # held by a longer one already
        texts[text] = None
        chars += len(text)
        if chars > self._threshold:
            while texts and chars > self._target:
                oldest, _ = texts.popitem(last=False)
                chars -= len(oldest)
        self._chars[replica_id] = chars

    def _forget(self, replica_id: str) -> None:
        self._texts.pop(replica_id, None)
        self._chars.pop(replica_id, None)


def _by_load(replicas: list[RunningReplica], loads: Mapping[str, int]) -> list[list[RunningReplica]]:
    """``replicas`` in ranks of equal load, the least loaded first (the chooser breaks
    the ties left by its own count of requests in flight)."""
    ranks: dict[int, list[RunningReplica]] = {}
    for replica in replicas:
        ranks.setdefault(loads[replica.replica_id], []).append(replica)
    return [ranks[load] for load in sorted(ranks)]


def engine_load(replica: RunningReplica) -> int:
    """The replies ``replica``'s engine reported running and waiting (0 when it reported
    neither: no stats, or a deployment whose stats are others)."""
    return int(_stat(replica, "running") + _stat(replica, "waiting"))


def kv_cache_use(replica: RunningReplica) -> float:
    """The share of ``replica``'s KV cache its engine reported in use, 0 to 1 (0 when it
    reported none)."""
    return min(_stat(replica, "kv_cache_use"), 1.0)


def _stat(replica: RunningReplica, name: str) -> float:
    """A number ``replica`` reported, 0 when it is missing, negative or not a number
    (stats are whatever its deployment's ``record_routing_stats()`` returned)."""
    value = replica.routing_stats.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        return 0.0
    return float(value)


def request_text(request: PendingRequest) -> str | None:
    """The text a request's prompt starts with, as the module's docstring says; None:
    it carries none that can be read. Read once per request (kept in its memo)."""
    if "text" not in request.memo:
        request.memo["text"] = _read_text(request)
    text: str | None = request.memo["text"]
    return text


def _read_text(request: PendingRequest) -> str | None:
    for argument in (*request.args, *request.kwargs.values()):
        text = _text_of(argument)
        if text is not None:
            return text
    if request.body and request.body_complete and len(request.body) <= MAX_BODY_BYTES:
        try:
            return _text_of(json.loads(request.body))
        except (ValueError, UnicodeDecodeError):
            return None
    return None


def _text_of(value: Any) -> str | None:
    for name in ("messages", "prompt"):
        found = value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)
        if found:
            return _joined(found)
    return None


def _joined(found: Any) -> str | None:
    """A prompt's text: a string as is, token ids joined, messages' contents joined (a
    content of parts: their texts)."""
    if isinstance(found, str):
        return found
    if not isinstance(found, list | tuple):
        return None
    if all(isinstance(item, int) for item in found):
        return ",".join(map(str, found))
    pieces: list[str] = []
    for message in found:
        content = (
            message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
        )
        if isinstance(content, str):
            pieces.append(content)
        elif isinstance(content, list | tuple):
            pieces.extend(part.get("text") or "" for part in content if isinstance(part, Mapping))
    return "".join(pieces) or None
