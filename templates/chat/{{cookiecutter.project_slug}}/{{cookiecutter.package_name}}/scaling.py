"""How the model pool scales: each replica reports its own load, and a policy decides on it.

The pattern for any model (docs/autoscaling.md, "Scaling a model on its own load"):

1. The engine says what it holds (:class:`EngineLoad`): the replies in its decode slots
   and those queued for one, its KV cache's use, and, where it keeps them, the tokens each
   reply may still produce and how long a decoding step takes lately.
2. ``ChatModel.record_autoscaling_stats()`` turns that into numbers
   (:func:`replica_metrics`): among them ``late``, the queued replies expected to wait
   longer than ``CHAT_SCALE_WAIT_S`` for a slot.
3. :func:`scale_on_load`, the pool's autoscaling policy, adds replicas for the late
   replies that the pool's free slots cannot take, and removes them when fewer replicas
   would hold every reply.

This module imports nothing of the application at run time (only the toolkit's
:class:`EngineLoad`): the controller receives the policy by value and runs it without the
application's modules.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any

# What an engine holds (slots, running and waiting replies, KV cache use, step time): the
# toolkit's LLM engines report it; a module with no other import, so the policy stays light.
from app_toolkit.llm import EngineLoad

if TYPE_CHECKING:  # the controller runs the policy without the application's modules
    import app_toolkit as tk

    from .settings import Settings

#: The pool's autoscaling options before ``CHAT_MODEL_AUTOSCALING`` (production pace: a
#: backlog must last 10 s to add replicas, an idle replica 10 minutes to go; replicas
#: report their load every 2 s).
DEFAULTS: dict[str, float] = {
    "upscale_delay_s": 10.0,
    "downscale_delay_s": 600.0,
    "metrics_interval_s": 2.0,
}


def slot_waits(load: EngineLoad) -> tuple[list[int], int]:
    """Decoding steps until each queued reply gets a slot, in queue order, and until a
    reply arriving after them would.

    Each slot frees when its reply has produced its remaining tokens; the queued replies
    take the slots in the order they free, then hold them for their max_tokens. Upper
    bounds, as the remaining tokens are. Needs the load's per-reply detail.
    """
    if load.remaining is None or load.queued is None:
        raise ValueError("slot_waits needs the replies' detail: this engine reports counts only")
    if load.slots <= 0:
        return [0] * len(load.queued), 0
    frees = sorted(load.remaining)[: load.slots]
    frees += [0] * (load.slots - len(frees))  # a free slot is free now
    heapq.heapify(frees)
    waits = []
    for _, max_tokens in load.queued:
        start = heapq.heappop(frees)
        waits.append(start)
        heapq.heappush(frees, start + max_tokens)
    return waits, frees[0]


def replica_metrics(load: EngineLoad, target_wait_s: float) -> dict[str, float]:
    """A replica's custom autoscaling metrics (all counts are replies):

    - ``running``, ``waiting``: replies holding a decode slot, queued for one;
    - ``slots``: decode slots (0: no limit); ``free``: slots neither taken nor promised
      to a queued reply;
    - ``kv_cache_use``: the share of the engine's KV cache in use (0 to 1);
    - ``tokens_waiting``: prompt tokens of the queued replies plus the tokens the running
      ones may still produce;
    - ``slot_wait_s``: the estimated wait for a slot of a reply arriving now;
    - ``late``: queued replies estimated to wait longer than ``target_wait_s``.

    Waits are decoding steps times the step's recent time: prompt reading is left out,
    and remaining tokens are upper bounds, so the estimates err towards waiting longer.
    An engine that reports counts only (vLLM) gives no estimate: each queued reply counts
    as late, and ``tokens_waiting`` and ``slot_wait_s`` are 0.
    """
    counts = {
        "running": float(load.running),
        "waiting": float(load.waiting),
        "slots": float(load.slots),
        "free": float(max(0, load.slots - load.running - load.waiting)),
        "kv_cache_use": load.kv_cache_use,
    }
    if load.remaining is None or load.queued is None:
        return {**counts, "tokens_waiting": 0.0, "slot_wait_s": 0.0, "late": float(load.waiting)}
    waits, next_free = slot_waits(load)
    return {
        **counts,
        "tokens_waiting": float(sum(prompt for prompt, _ in load.queued) + sum(load.remaining)),
        "slot_wait_s": next_free * load.step_s,
        "late": float(sum(1 for steps in waits if steps * load.step_s > target_wait_s)),
    }


# --8<-- [start:policy]
def scale_on_load(context: tk.AutoscalingContext) -> tuple[int, dict[str, Any]]:
    """The model pool's policy: replicas for the replies that would wait too long.

    - Late replies (newest samples; the replies waiting in the callers' queues, which
      ``total_num_requests`` counts beyond what the replicas hold on average, count as late) beyond
      the pool's free slots want that many more slots: the running replicas plus one
      replica per ``slots`` of them (never fewer than the target: replicas may still be
      starting).
    - Late replies the free slots can take: the target holds (new requests go there).
    - None late: the fewest replicas whose slots hold every running and queued reply
      (averaged over the look-back), never more than the target.
    - Replicas that report no slot limit (echo, openai): requests per replica, as the
      built-in policy (``target_ongoing_requests``).

    The answer stays within the capacity-adjusted bounds; the config's delays apply to it.
    """
    newest = _newest(context)
    slots = max(newest.get("slots", {}).values(), default=0.0)
    target = context.target_num_replicas
    if not newest:  # no replica has reported yet
        wanted = target
    elif slots <= 0:
        per_replica = context.config.target_ongoing_requests if context.config else 1.0
        wanted = math.ceil(context.total_num_requests / per_replica)
    else:
        # Replies admitted only to free slots: the rest wait at the callers, beyond what
        # the replicas hold, and will wait for a slot too (both averaged over the look-back).
        averaged = context.aggregated_metrics
        in_replicas = sum(averaged.get("running", {}).values()) + sum(averaged.get("waiting", {}).values())
        # Whole replies only: an average's fraction is requests in transit, not a queue.
        at_callers = max(0, math.floor(context.total_num_requests - in_replicas))
        late = sum(newest.get("late", {}).values()) + at_callers
        free = sum(newest.get("free", {}).values())
        if late > free:
            wanted = max(target, context.current_num_replicas + math.ceil((late - free) / slots))
        elif late > 0:
            wanted = target
        else:
            wanted = min(target, math.ceil(in_replicas / slots))
    lower, upper = context.capacity_adjusted_min_replicas, context.capacity_adjusted_max_replicas
    return max(lower, min(upper, wanted)), {}


# --8<-- [end:policy]


def _newest(context: tk.AutoscalingContext) -> dict[str, dict[str, float]]:
    """Each metric's newest sample per replica (a backlog is a fact about now; the
    upscale delay is what asks it to last)."""
    return {
        name: {replica: samples[-1].value for replica, samples in replicas.items() if samples}
        for name, replicas in context.raw_metrics.items()
    }


def autoscaling_config(settings: Settings) -> dict[str, Any]:
    """The model pool's ``autoscaling_config``: 1 to ``max_model_replicas`` replicas, this
    module's policy unless ``scaling`` is ``requests`` (then ``max_batch_size`` requests
    per replica), ``DEFAULTS`` and ``model_autoscaling`` over them."""
    config: dict[str, Any] = {
        "min_replicas": 1,
        "max_replicas": settings.max_model_replicas,
        "target_ongoing_requests": settings.max_batch_size,
        **DEFAULTS,
        **settings.model_autoscaling,
    }
    if settings.scaling == "load":
        config["policy"] = {"policy_function": scale_on_load}
    return config
