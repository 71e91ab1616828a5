"""What the reply to a handle call means to its caller: the method's value, or the
exception to raise (the method's own when it pickles, else its type and message)."""

from __future__ import annotations

import pickle

from app_toolkit._runtime.messages import CallFailure, CallResult, DeploymentID
from app_toolkit._runtime.routing.replica_client import Reply
from app_toolkit.exceptions import DeploymentCallError, ReplicaUnavailableError


def value_of(reply: Reply, deployment: DeploymentID) -> object:
    """The value a unary call's ``reply`` carries, or raise what it says; frees the
    reply (its exchange and replica slot) either way."""
    try:
        first = reply.first
        if isinstance(first, CallResult):
            return first.value
        if isinstance(first, CallFailure):
            raise exception_of(first)
        raise ReplicaUnavailableError(f"Unexpected answer {type(first).__name__} from {deployment}")
    finally:
        reply.exchange.cancel()
        reply.release()


def exception_of(failure: CallFailure) -> Exception:
    """The exception a failed call raises in its caller."""
    if failure.exception is not None:
        try:
            exc = pickle.loads(failure.exception)
            if isinstance(exc, Exception):
                return exc
        except Exception:  # noqa: BLE001 - not unpicklable here: fall back to type and message
            pass
    return DeploymentCallError(failure.type_name, failure.message)
