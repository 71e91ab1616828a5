"""How a front reaches the cluster's ledger of API key limits (``_runtime/quotas.py``):
the controller's, or a ledger of the front's own while the controller does not answer.

An ask the controller does not answer within :data:`ASK_TIMEOUT_S` (or that fails) is
answered by the front's own ledger, and so is every ask after it until a probe in the
background (one at a time, every :data:`PROBE_EVERY_S`) finds the controller answering
again: a controller that is down costs one request one timeout, not every request. Both
changes are logged once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from app_toolkit._runtime.quotas import QuotaAsk, QuotaGrant, QuotaLedger, TakeQuota

logger = logging.getLogger("app_toolkit.proxy")

#: How long an ask may take before the front counts the controller as unreachable.
ASK_TIMEOUT_S = 2.0
#: How often the front tries the controller again while it answers asks itself.
PROBE_EVERY_S = 2.0


class LedgerLink:
    """One front's way to the ledger. ``take``: the controller's (None: the front's own
    only, as in tests without a controller)."""

    def __init__(self, take: TakeQuota | None) -> None:
        self.front = uuid.uuid4().hex
        self._take = take
        self._own = QuotaLedger(time.time)
        self._probe: asyncio.Task[None] | None = None  # set while the controller is counted out

    async def send(self, asks: tuple[QuotaAsk, ...]) -> tuple[QuotaGrant, ...]:
        """The ledger's answer to ``asks``."""
        if self._take is None or self._probe is not None:
            return self._own.take(self.front, asks)
        try:
            return await asyncio.wait_for(self._take(self.front, asks, ()), ASK_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - any failure: the front's own ledger
            if self._probe is None:
                logger.warning(
                    "API key limits: the controller did not answer (%s); this front keeps them on "
                    "its own until it does",
                    type(exc).__name__,
                )
                self._probe = asyncio.get_running_loop().create_task(self._wait_for_controller())
            return self._own.take(self.front, asks)

    @property
    def cut_off(self) -> bool:
        """The front answers its asks itself (the controller did not answer)."""
        return self._probe is not None

    def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()

    async def _wait_for_controller(self) -> None:
        assert self._take is not None
        while True:
            await asyncio.sleep(PROBE_EVERY_S)
            try:
                await asyncio.wait_for(self._take(self.front, (), ()), ASK_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - not yet: try again
                continue
            logger.info("API key limits: the controller answers again")
            self._probe = None
            return
