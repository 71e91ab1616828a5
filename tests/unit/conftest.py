"""Unit tests are pure: no socket is bound or connected, no process started.

A test that needs a network endpoint or another process belongs in tests/integration/
(or tests/behaviour/); protocol code is tested here over fake transports and
``socket.socketpair()`` (asyncio's event loop makes one for itself too).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

#: Audit events (docs.python.org/3/library/audit_events.html) a unit test must not raise.
_FORBIDDEN = {
    "socket.bind": "binds a socket",
    "socket.connect": "connects a socket",
    "socket.sendto": "sends a datagram",
    "socket.getaddrinfo": "resolves a host name",
    "subprocess.Popen": "starts a process",
    "os.posix_spawn": "starts a process",
    "os.fork": "forks",
    "os.exec": "replaces its process",
    "os.system": "runs a shell command",
}
_guarding = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _guarding and event in _FORBIDDEN:
        raise RuntimeError(
            f"A unit test {_FORBIDDEN[event]} ({event}{args!r:.120}); "
            "move it to tests/integration/ or give it a fake transport"
        )


sys.addaudithook(_audit)  # hooks stay for the process: _guarding turns this one on and off


@pytest.fixture(autouse=True)
def _no_sockets_or_processes() -> Iterator[None]:
    global _guarding
    _guarding = True
    try:
        yield
    finally:
        _guarding = False


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
