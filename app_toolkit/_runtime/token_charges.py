"""Tokens charged to API keys where replies end (``app_toolkit.charge_tokens``), sent to
the controller's ledger (``quotas.py``) in batches: a process's charges of the last
:data:`FLUSH_S` go in one call, whatever the number of replies that ended, and one call is
out at a time. A charge that cannot be sent (the controller unreachable for
:data:`SEND_TIMEOUT_S`) is logged and dropped: the key's window is charged less, never
more."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from app_toolkit import metrics
from app_toolkit._runtime.backends.base import current_session
from app_toolkit._runtime.session import Session
from app_toolkit.exceptions import ReplicaUnavailableError

logger = logging.getLogger("app_toolkit")

TOKENS = metrics.Counter(
    "app_toolkit_api_key_tokens_total",
    "Tokens charged to API keys where replies end (app_toolkit.llm's replies, charge_tokens), "
    "by the key's name.",
    ("key",),
)

#: How long charges gather before they are sent.
FLUSH_S = 0.1
#: How long a send may take.
SEND_TIMEOUT_S = 5.0
#: The most keys one process gathers charges of between two sends (more are dropped).
_MOST_KEYS = 10_000
#: Who a charge is from, to the ledger (charges ask for nothing).
_CHARGER = "charges"


class TokenCharges:
    """This process's charges not sent yet, and the one send that may be out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        #: The session whose send is set off or out (it takes what gathers meanwhile), and
        #: when it was set off: a send that has not run for :data:`SEND_TIMEOUT_S` after
        #: that (its loop gone) is set off again, as is one of another session.
        self._sending: tuple[Session, float] | None = None
        self._dropped = False  # charges were dropped since the last send (logged once)

    def add(self, key: str, tokens: int) -> None:
        """Charge ``tokens`` to the key named ``key`` (from any thread)."""
        session = current_session(create=False)
        if session is None or tokens <= 0:
            return
        with self._lock:
            if key not in self._pending and len(self._pending) >= _MOST_KEYS:
                self._dropped = True
                return
            self._pending[key] = self._pending.get(key, 0) + tokens
            now = time.monotonic()
            out = self._sending
            if out is not None and out[0] is session and now - out[1] < FLUSH_S + SEND_TIMEOUT_S + 1:
                return
            self._sending = (session, now)
        try:
            session.data_plane.submit(self._send(session))
        except (ReplicaUnavailableError, RuntimeError):  # the data plane closed (the toolkit stopping)
            with self._lock:
                self._sending = None

    async def _send(self, session: Session) -> None:
        """Send what gathers, every :data:`FLUSH_S`, until nothing does."""
        try:
            while True:
                await asyncio.sleep(FLUSH_S)
                with self._lock:
                    charges, self._pending = tuple(self._pending.items()), {}
                    dropped, self._dropped = self._dropped, False
                    if not charges:
                        self._sending = None
                        return
                    self._sending = (session, time.monotonic())
                if dropped:
                    logger.warning(
                        "API key limits: token charges of more than %d keys were dropped", _MOST_KEYS
                    )
                try:
                    await asyncio.wait_for(session.take_quota(_CHARGER, (), charges), SEND_TIMEOUT_S)
                except Exception as exc:  # noqa: BLE001 - any failure: these charges are lost, and said so
                    logger.warning(
                        "API key limits: %d keys' token charges could not reach the controller (%s)",
                        len(charges),
                        type(exc).__name__,
                    )
        except BaseException:
            with self._lock:
                self._sending = None
            raise


CHARGES = TokenCharges()
