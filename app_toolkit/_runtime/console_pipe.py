"""A short way to the console of the process that started an embedded Ray, for lines
written at a high rate.

Ray shows a worker's standard error on the driver's console by relaying it: its log
monitor reads the worker's log file, publishes the lines through the GCS, and the driver
prints them — work in three more processes for every access line, which competes with
the replicas for the cores. The process that starts the embedded Ray (``app-toolkit run``,
or ``tk.run`` from a script: ``backends/ray/cluster.py``) instead makes a named pipe in a
private folder (mode 0700) and names it in the environment, which its raylet passes to
the workers on its node; their batched lines (``log_format.BatchWriter``: the access log)
go into the pipe, and a thread of that process copies them to its standard error.

The pipe is made to hold :data:`PIPE_BYTES` (the kernel's 64 KiB is less than one
batch of access lines at a few thousand requests a second, and what overflowed took Ray's
relay after all): a write that does not fit, a line too long for one atomic write, or a
pipe with no reader goes to standard error as before (Ray's relay), so no line is lost
and none is torn: each write is of whole lines and at most ``PIPE_BUF`` bytes, which the
kernel never interleaves with another process's. Workers on other nodes, and every
process of a cluster a process joins rather than starts, do not have the pipe and log as
before.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import select
import shutil
import sys
import tempfile
import threading
from typing import BinaryIO

logger = logging.getLogger("app_toolkit.ray")

PIPE_ENV = "APP_TOOLKIT_CONSOLE_PIPE"

#: The kernel writes at most this many bytes to a pipe in one piece (POSIX: at least 512).
ATOMIC = select.PIPE_BUF
#: What the pipe is made to hold (Linux: at most ``/proc/sys/fs/pipe-max-size``, 1 MiB by
#: default, for a process without CAP_SYS_RESOURCE): several batches of access lines.
PIPE_BYTES = 1 << 20


class PipeWriter:
    """A worker's end: writes whole lines into the console pipe while it can."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None
        self._gone = False  # no reader (or no pipe here): standard error from now on

    def write(self, text: str) -> str:
        """Write ``text`` (lines, each ending in a newline); return what did not go in,
        from a line's start (empty when everything did): the caller writes that its
        usual way."""
        if self._gone:
            return text
        fd = self._fd
        if fd is None:
            try:
                fd = self._fd = os.open(self._path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:  # ENXIO: nobody reads it; ENOENT: not on this node
                self._gone = True
                return text
        data = text.encode(errors="backslashreplace")  # as standard error writes it
        start, size = 0, len(data)
        while start < size:
            end = start + ATOMIC
            if end < size:
                end = data.rfind(b"\n", start, end) + 1
                if end <= start:  # a line longer than one atomic write
                    break
            try:
                start += os.write(fd, data[start:end])
            except BlockingIOError:  # the pipe is full: the rest goes the usual way
                break
            except OSError:  # EPIPE: the command stopped reading; anything else alike
                self.close()
                self._gone = True
                break
        return data[start:].decode(errors="backslashreplace") if start < size else ""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_writer: PipeWriter | None = None


def writer() -> PipeWriter | None:
    """This process's writer, if the process that started Ray named a pipe in its
    environment."""
    global _writer
    if _writer is None:
        path = os.environ.get(PIPE_ENV)
        if not path:
            return None
        _writer = PipeWriter(path)
    return _writer


class ConsolePipe:
    """The end of the process that started Ray: the pipe, and a thread copying what comes
    out of it to ``out`` until :meth:`close`. Raises OSError if the pipe cannot be made (the caller then logs
    the usual way)."""

    def __init__(self, out: BinaryIO) -> None:
        self._pid = os.getpid()  # a forked child leaves the pipe to its parent
        self._folder = tempfile.mkdtemp(prefix="app-toolkit-console-")  # mode 0700
        self.path = os.path.join(self._folder, "lines")
        try:
            os.mkfifo(self.path, 0o600)
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        # Held open so the reader sees no end of file while no worker has it open.
        self._keep = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        _grow(self._fd)
        self._out = out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._copy, name="app-toolkit-console", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        """The thread: copy until stopped, then what is left (bounded), then close."""
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        try:
            while not self._stop.is_set():
                if poller.poll(200):
                    self._drain(_PER_WAKE)
            self._drain(_AT_CLOSE)
        finally:
            os.close(self._keep)
            os.close(self._fd)

    def _drain(self, reads: int) -> None:
        for _ in range(reads):
            try:
                data = os.read(self._fd, 1 << 16)
            except OSError:  # BlockingIOError: nothing more for now
                return
            if not data:
                return
            with contextlib.suppress(OSError, ValueError):  # a closed console: nothing to show
                self._out.write(data)
                self._out.flush()

    def close(self) -> None:
        """Copy what is left, stop, and remove the pipe: workers that write after this
        find no reader and log the usual way."""
        if os.getpid() != self._pid:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        shutil.rmtree(self._folder, ignore_errors=True)


def _grow(fd: int) -> None:
    """Make the pipe hold :data:`PIPE_BYTES`, as far as this system lets it (only Linux
    can; elsewhere, or over the limit, the kernel's size stays)."""
    set_size, get_size = getattr(fcntl, "F_SETPIPE_SZ", None), getattr(fcntl, "F_GETPIPE_SZ", None)
    if set_size is None or get_size is None:
        return
    with contextlib.suppress(OSError):
        wanted = min(PIPE_BYTES, _pipe_limit())
        if wanted > fcntl.fcntl(fd, get_size):
            fcntl.fcntl(fd, set_size, wanted)


def _pipe_limit() -> int:
    """The most a pipe may hold here (``/proc/sys/fs/pipe-max-size``)."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return PIPE_BYTES


_console: ConsolePipe | None = None
_console_lock = threading.Lock()


def for_workers() -> str | None:
    """The path of this process's console pipe, made on first call and copied to its
    standard error until the process exits; None when standard error is not the process's
    own file descriptor 2 (a notebook, a capturing test runner: Ray's relay shows lines
    there) or the pipe cannot be made."""
    global _console
    with _console_lock:
        if _console is None:
            out = _real_stderr()
            if out is None:
                return None
            try:
                _console = ConsolePipe(out)
            except OSError as exc:
                logger.warning("Access lines go through Ray's log relay: %s", exc)
                return None
        return _console.path


def close() -> None:
    """Copy what is left and remove this process's pipe, if it made one (after the Ray it
    started has stopped: its workers' last lines take the pipe)."""
    global _console
    with _console_lock:
        console, _console = _console, None
    if console is not None:
        console.close()


def _real_stderr() -> BinaryIO | None:
    try:
        if sys.stderr.fileno() != 2:
            return None
        out: BinaryIO = sys.stderr.buffer
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    return out


#: Reads (64 KiB each) per wake-up, so a stop is seen between them; and at close.
_PER_WAKE = 16
_AT_CLOSE = 64
