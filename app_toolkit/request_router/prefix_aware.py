"""Prefix-aware routing: a prompt goes where prompts that start like it went, so the
engine there finds their keys and values in its prefix cache (Ray Serve LLM's
``PrefixCacheAffinityRouter``, with Ray 2.60's rule).

Per request, while the callers' loads are balanced (the most and fewest requests in
flight on the replicas differ by at most ``imbalanced_threshold``, 10 by default where
Ray 2.60's is infinity): the replicas whose
routed texts share the longest prefix with this one, if that prefix is at least
``match_rate_threshold`` of the text; else the replicas holding the fewest characters.
When the loads are imbalanced, or the request carries no text: power of two choices.
Where Ray's router then only retries those replicas, a request whose chosen replicas are
all full goes to another with a free slot (power of two), so that it never waits while a
replica idles.

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
    ) -> None:
        """Ray's kwargs, and its defaults but one: ``imbalanced_threshold`` is 10 where Ray
        2.60's is infinity (its router then never falls back to power of two choices), so
        that a prefix many requests share cannot pile them onto one replica while others
        idle. ``do_eviction`` and ``eviction_interval_secs`` are taken with no effect: the
        record is always bounded, and cut back as it grows past the threshold, not on a
        timer."""
        self._imbalanced_threshold = math.inf if imbalanced_threshold is None else float(imbalanced_threshold)
        self._match_rate_threshold = 0.1 if match_rate_threshold is None else float(match_rate_threshold)
        threshold = 400_000 if eviction_threshold_chars is None else int(eviction_threshold_chars)
        target = threshold if eviction_target_chars is None else int(eviction_target_chars)
        if not 0 <= self._match_rate_threshold <= 1:
            raise ValueError(f"match_rate_threshold must be within [0, 1], got {match_rate_threshold}")
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
        fallback = super().choose_replicas(candidate_replicas, pending_request)
        text = request_text(pending_request) if pending_request is not None else None
        if not text or not candidate_replicas:
            return fallback
        loads = [self.queue_len(replica.replica_id) for replica in candidate_replicas]
        if max(loads) - min(loads) > self._imbalanced_threshold:
            return fallback
        matched = {
            replica.replica_id: self._longest(replica.replica_id, text) for replica in candidate_replicas
        }
        longest = max(matched.values())
        if longest and longest / len(text) >= self._match_rate_threshold:
            best = [replica for replica in candidate_replicas if matched[replica.replica_id] == longest]
        else:
            fewest = min(self._chars.get(replica.replica_id, 0) for replica in candidate_replicas)
            best = [
                replica for replica in candidate_replicas if self._chars.get(replica.replica_id, 0) == fewest
            ]
        return [best, *fallback]

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
