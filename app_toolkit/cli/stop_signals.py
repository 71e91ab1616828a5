"""How ``app-toolkit run`` stops: one SIGINT or SIGTERM, at any moment.

Either signal raises KeyboardInterrupt in the main thread, wherever it is: importing the
app, waiting for a deploy (a model loading), serving, watching for changes.
KeyboardInterrupt, not an exception of our own, because it is what every call that blocks
there knows how to be interrupted by: ``time.sleep`` and lock waits, watchfiles' watch,
and ``ray.get`` (Ray turns a pending KeyboardInterrupt, and only it, into an interrupted
wait; another exception raised by a handler there would be lost).

Starting the toolkit is the exception (:meth:`StopSignals.deferred`). Ray interrupted
half-way through starting its processes has registered none of them for its shutdown:
its GCS and raylet die with this process, but the agents the raylet started outlive
them (seen: a DashboardAgent and a RuntimeEnvAgent, still there 30 s later). And on
Ray, a controller interrupted while it starts has no session to stop it by. So a signal
that comes meanwhile stops the command once the start has returned, a few seconds later.

The command installs the handlers itself, first thing: a shell that starts a command in
the background makes it ignore SIGINT, and Python leaves it ignored.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future
from types import FrameType
from typing import TypeVar

import click

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """From construction on, SIGINT and SIGTERM raise KeyboardInterrupt in the main
    thread (``received`` is the first that came), except in :meth:`deferred`. One that
    comes after the first (``repeated``) raises again: the user asks to stop now."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self.repeated = False
        self._deferring = False
        self._install()

    def _install(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
            if self._deferring:  # said now, or the user sends another, thinking it lost
                name = self.received.name
                click.echo(f"app-toolkit: {name} received; stopping once the toolkit has started")
        else:
            self.repeated = True
        if not self._deferring:
            raise KeyboardInterrupt

    def deferred(self, work: Callable[[], T]) -> T:
        """``work``'s result; stop signals that come meanwhile, a second one too, raise
        KeyboardInterrupt once it has returned (a process that exits half-way through
        starting Ray leaves the agents behind all the same).

        ``work`` runs in a thread of its own while the main thread waits for it: then
        ``ray.init``, which installs a SIGTERM handler of its own (``sys.exit``) when it
        runs in the main thread, leaves ours in place.
        """
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(work())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                done.set_exception(exc)

        ray_worker_log = logging.getLogger("ray._private.worker")
        ray_worker_log.addFilter(_no_sigterm_handler_warning)
        self._deferring = True
        try:
            threading.Thread(target=run, name="app-toolkit-start", daemon=True).start()
            result = done.result()
        finally:
            self._deferring = False
            ray_worker_log.removeFilter(_no_sigterm_handler_warning)
            # Again: what ran may have replaced them (Ray's crash handler takes SIGTERM
            # when its driver connects, unless it was turned off: see serve.py).
            self._install()
        if self.received is not None:
            raise KeyboardInterrupt
        return result


def _no_sigterm_handler_warning(record: logging.LogRecord) -> bool:
    """Drops Ray's warning that it set no SIGTERM handler (it sets one only when started
    from the main thread): this command has its own."""
    return not record.getMessage().startswith("SIGTERM handler is not set")
