"""A caller's way to one replica, and what a request opened there gives back.

The backends implement :class:`ReplicaClient` (a channel connection, or an in-process
call), one per replica, made by a :data:`Connect`; the dispatcher opens each request
through one and hands its caller a :class:`Reply`: the replica's first answer, the
exchange for the rest, and the replica slot to give back once the reply is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.messages import Answer, DeploymentID, ReplicaInfo, Request
from app_toolkit.exceptions import RequestLostError


class ReplicaClient(Protocol):
    """A caller's way to one replica (a channel connection, or an in-process call)."""

    async def open(self, request: Request) -> Exchange: ...

    def close(self) -> None: ...


Connect = Callable[[ReplicaInfo], ReplicaClient]


@dataclass
class Reply:
    """The first answer of an accepted request, the exchange for the rest, and its slot."""

    first: Answer
    exchange: Exchange
    replica_id: str
    _release: Callable[[str], None]
    _lost: Callable[[str], RequestLostError]
    _released: bool = False
    #: The deployment whose replica it is (a traffic split's variant, where one chose it).
    deployment: DeploymentID | None = None

    def release(self) -> None:
        """Give the replica slot back; call once the response has been fully read."""
        if not self._released:
            self._released = True
            self._release(self.replica_id)

    def lost(self) -> RequestLostError:
        """The error to raise when the replica was lost before the reply ended (a stream
        cut off), as a request lost before its first answer raises."""
        return self._lost(self.replica_id)
