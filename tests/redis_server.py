"""A real redis-server on 127.0.0.1 for the tests that need one (Debian's package, which
``make test`` installs): started once per test session, stopped by its PID."""

from __future__ import annotations

import shutil
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


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway Redis (no persistence, loopback only); yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: `make test` installs it (apt-get install redis-server)")
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="app-toolkit-redis-") as workdir:
        log = Path(workdir) / "redis.log"
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", workdir, "--logfile", str(log)]
        server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1) as probe:
                        probe.sendall(b"PING\r\n")
                        if probe.recv(16).startswith(b"+PONG"):
                            break
                except OSError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    said = log.read_text() if log.exists() else ""
                    pytest.fail(f"redis-server did not start on port {port}: {said[-500:]}")
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
