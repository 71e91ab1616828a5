"""The backend calls the controller makes for a replica's actions, each turned into the
event that ``replica_transition`` takes next (a failure is an event too, never raised)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from app_toolkit._runtime.controller import controller_metrics
from app_toolkit._runtime.controller.backend import Backend, Seat
from app_toolkit._runtime.controller.deployment_state import StartReplica
from app_toolkit._runtime.controller.replica_state import (
    CheckHealth,
    Event,
    HealthFailed,
    HealthPassed,
    Reconfigured,
    ReconfigureFailed,
    ReconfigureReplica,
    Started,
    StartFailed,
    StopReplica,
)
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit.exceptions import ReplicaUnavailableError

logger = logging.getLogger("app_toolkit.controller")


async def start(backend: Backend[Any], deployment: DeploymentID, action: StartReplica, seat: Seat) -> Event:
    try:
        info, handle = await backend.start_replica(action.replica_id, action.spec, seat)
    except Exception as exc:  # noqa: BLE001 - counted as a failed start, shown in status
        controller_metrics.START_FAILURES.inc(deployment.app, deployment.name)
        return StartFailed(str(exc))
    controller_metrics.STARTS.inc(deployment.app, deployment.name)
    return Started(info, handle, action.spec.config)


async def stop(backend: Backend[Any], action: StopReplica) -> None:
    """Drain the replica (within its timeout), else kill it. The caller reports
    ``Stopped`` whatever happens here."""
    if action.graceful:
        try:
            async with asyncio.timeout(action.drain_timeout_s):
                await backend.stop_replica(action.handle, True, action.hurry, action.grace_s)
            return
        except TimeoutError:
            logger.warning(
                "Replica %s did not drain within %s s; killing it", action.replica_id, action.drain_timeout_s
            )
    await backend.stop_replica(action.handle, graceful=False)


async def check(backend: Backend[Any], deployment: DeploymentID, action: CheckHealth) -> Event:
    event: Event
    try:
        await backend.check_health(action.handle, action.timeout_s)
    except ReplicaUnavailableError as exc:
        event = HealthFailed(str(exc), gone=True)
    except TimeoutError:
        error = f"no answer within {action.timeout_s} s (is its event loop blocked?)"
        event = HealthFailed(error, gone=False, hung=True)
    except Exception as exc:  # noqa: BLE001 - any failure counts against the threshold
        event = HealthFailed(str(exc), gone=False)
    else:
        return HealthPassed()
    controller_metrics.HEALTH_FAILURES.inc(deployment.app, deployment.name)
    return event


async def reconfigure(backend: Backend[Any], action: ReconfigureReplica) -> Event:
    try:
        await backend.reconfigure_replica(action.handle, action.config)
    except Exception as exc:  # noqa: BLE001 - user code failed: replace the replica
        return ReconfigureFailed(str(exc))
    return Reconfigured(action.config)
