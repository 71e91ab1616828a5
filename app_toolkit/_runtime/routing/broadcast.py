"""A broadcast: one call sent to every replica of a deployment, on the caller's side.

The replicas are those of the caller's replica table when the broadcast starts (a first
use waits for the table): a replica still starting is not in it, nor is one that was
draining when the table was made. Each call goes to its replica through the dispatcher's
connection to it (the same transport as every call), past the caller's queue
(``max_queued_requests``) and the replica's ``max_ongoing_requests`` (the replica admits
it even when full). A replica that turns out to be draining is left out; a replica that
fails gives its exception in its place, and the others still answer.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Final

from app_toolkit._runtime.messages import DeploymentID, MethodCall, ReplicaInfo
from app_toolkit._runtime.routing import caller_metrics
from app_toolkit._runtime.routing.data_plane import DataPlane
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit._runtime.routing.replies import value_of


@dataclass(frozen=True, slots=True)
class Failed:
    """A replica's call raised ``exception`` (or never reached the replica)."""

    exception: Exception


#: What one replica's call gave: its value or how it failed.
Outcome = object | Failed

_LEFT_OUT: Final = object()  # the replica was draining: not one of the broadcast's replicas


async def fan_out(plane: DataPlane, deployment: DeploymentID, call: MethodCall) -> list[Outcome]:
    """Send ``call`` (marked ``broadcast``) to every replica of ``deployment``; return what
    each gave, in the table's order, once all have answered (none: no replica runs).
    Raises ReplicaUnavailableError if the deployment was deleted or never existed."""
    dispatcher = await plane.subscriber.dispatcher_with_table(deployment)
    outcomes = await asyncio.gather(*(_call_one(dispatcher, info, call) for info in dispatcher.replicas()))
    return [outcome for outcome in outcomes if outcome is not _LEFT_OUT]


async def _call_one(dispatcher: Dispatcher, info: ReplicaInfo, call: MethodCall) -> Outcome:
    started = time.perf_counter()
    outcome = "error"
    try:
        reply = await dispatcher.send_to(info, call)
        if reply is None:
            outcome = ""
            return _LEFT_OUT
        value = value_of(reply, dispatcher.deployment)
        outcome = "ok"
        return value
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    except Exception as exc:  # noqa: BLE001 - the caller gets it in this replica's place
        return Failed(exc)
    finally:
        if outcome:
            caller_metrics.called(dispatcher.deployment, call.method, outcome, time.perf_counter() - started)


def results(outcomes: list[Outcome], return_exceptions: bool) -> list[object]:
    """The values of a broadcast's ``outcomes``; a failure is raised (the first, in their
    order), or with ``return_exceptions`` put in its replica's place."""
    values: list[object] = []
    for outcome in outcomes:
        if isinstance(outcome, Failed):
            if not return_exceptions:
                raise outcome.exception
            values.append(outcome.exception)
        else:
            values.append(outcome)
    return values
