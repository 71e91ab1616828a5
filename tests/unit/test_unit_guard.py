"""The guard of tests/unit/conftest.py: a unit test that binds or connects a socket, or
starts a process, fails with the fix in its message."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def test_binding_or_connecting_a_socket_fails_the_test() -> None:
    with socket.socket() as sock:
        with pytest.raises(RuntimeError, match="binds a socket.*tests/integration/"):
            sock.bind(("127.0.0.1", 0))
        with pytest.raises(RuntimeError, match="connects a socket"):
            sock.connect(("127.0.0.1", 9))


def test_starting_a_process_fails_the_test() -> None:
    with pytest.raises(RuntimeError, match="starts a process"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_a_socket_pair_is_allowed() -> None:
    # What asyncio's loops make for themselves, and a fake transport's two ends.
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"
