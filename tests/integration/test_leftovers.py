"""The session-end check (tests/leftovers.py) finds a process this session started that
still runs, even one that left its process group and session, and kills it by PID."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from tests.leftovers import OWNER_VARIABLE, leftovers, stop_leftovers


def test_a_process_left_running_is_found_and_killed() -> None:
    # A mark of its own (a session's is inherited by what it starts): stopping this
    # session's own would stop its Ray cluster too.
    mark = uuid.uuid4().hex
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, OWNER_VARIABLE: mark},
        start_new_session=True,
    )
    try:
        assert [left.pid for left in leftovers(mark)] == [sleeper.pid]
        assert sleeper.pid not in [left.pid for left in leftovers(os.environ[OWNER_VARIABLE])]
        killed = stop_leftovers(mark, grace_s=0.5)
        assert sleeper.pid in [left.pid for left in killed]
        assert sleeper.wait(timeout=10) == -9  # SIGKILL
    finally:
        sleeper.kill()
        sleeper.wait()
