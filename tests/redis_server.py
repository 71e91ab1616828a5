"""A real redis-server on 127.0.0.1 for the tests that need one (Debian's package, which
``make test`` installs): started once per test session, stopped by its PID; a test can
start one of its own and kill and restart it on the same port."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server process (no persistence, loopback only) on a port of its own."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._binary = binary
        self._workdir = workdir
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Starts the server and returns once it answers PING."""
        log = self._workdir / "redis.log"
        args = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self._workdir), "--logfile", str(log)]
        self._process = server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as probe:
                    probe.sendall(b"PING\r\n")
                    if probe.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                said = log.read_text() if log.exists() else ""
                pytest.fail(f"redis-server did not start on port {self.port}: {said[-500:]}")
            time.sleep(0.05)

    def restart(self) -> None:
        """Kills the server (SIGKILL: its clients' connections drop, its data is gone) and
        starts a new one on the same port."""
        self.stop(signal.SIGKILL)
        self.start()

    def stop(self, how: signal.Signals = signal.SIGTERM) -> None:
        server, self._process = self._process, None
        if server is None:
            return
        server.send_signal(how)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    """A throwaway Redis, started; stopped when the block ends."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: `make test` installs it (apt-get install redis-server)")
    with tempfile.TemporaryDirectory(prefix="app-toolkit-redis-") as workdir:
        server = RedisServer(binary, Path(workdir))
        try:
            server.start()
            yield server
        finally:
            server.stop()
