"""Tokens charged to API keys where replies end (``app_toolkit.charge_tokens``), sent to
the controller's ledger (``quotas.py``) in batches: a process's charges of the last
:data:`FLUSH_S` go in one call, whatever the number of replies that ended. A charge
that cannot be sent (the controller unreachable) is logged and dropped: the key's
window is charged less, never more."""

from __future__ import annotations

import logging
import threading
import time

from app_toolkit._runtime.backends.base import current_session
from app_toolkit._runtime.session import Session
from app_toolkit.exceptions import ReplicaUnavailableError

logger = logging.getLogger("app_toolkit")

#: How long charges gather before they are sent.
FLUSH_S = 0.1
#: The most keys one process gathers charges of between two sends (more are dropped).
_MOST_KEYS = 10_000
#: A send set off this long ago that has not run (its loop closed): set off another.
_STUCK_S = 1.0
#: Who a charge is from, to the ledger (charges ask for nothing).
_CHARGER = "charges"


class TokenCharges:
    """This process's charges not sent yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        self._due_at = 0.0  # when a send was last set off (monotonic; 0: none is due)

    def add(self, key: str, tokens: int) -> None:
        """Charge ``tokens`` to the key named ``key`` (from any thread)."""
        session = current_session(create=False)
        if session is None or tokens <= 0:
            return
        with self._lock:
            if key not in self._pending and len(self._pending) >= _MOST_KEYS:
                return
            self._pending[key] = self._pending.get(key, 0) + tokens
            now = time.monotonic()
            if self._due_at and now - self._due_at < _STUCK_S:
                return
            self._due_at = now
        plane = session.data_plane

        def send_soon() -> None:
            plane.loop.call_later(FLUSH_S, self._send, session)

        plane.call_soon(send_soon)

    def _send(self, session: Session) -> None:
        with self._lock:
            charges, self._pending, self._due_at = tuple(self._pending.items()), {}, 0.0
        try:
            session.data_plane.submit(self._charge(session, charges))
        except ReplicaUnavailableError:  # the data plane closed meanwhile (the toolkit stopping)
            logger.warning("API key limits: %d keys' token charges dropped at shutdown", len(charges))

    @staticmethod
    async def _charge(session: Session, charges: tuple[tuple[str, int], ...]) -> None:
        try:
            await session.take_quota(_CHARGER, (), charges)
        except Exception as exc:  # noqa: BLE001 - any failure: the charges are lost, and said so
            logger.warning(
                "API key limits: %d keys' token charges could not reach the controller (%s)",
                len(charges),
                type(exc).__name__,
            )


CHARGES = TokenCharges()
