"""The long fuzz run (``make fuzz``): generated cases against uvicorn and the toolkit (on an
embedded Ray, default options) until the time is up. Each failure hypothesis finds is
shrunk, printed and added to the corpus (``corpus.jsonl``), and the search goes on with
the next seed.

    python -m tests.fuzz.run [--minutes 10] [--seed 1] [--batch 500]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from hypothesis import HealthCheck, given, seed, settings

import app_toolkit as tk
from tests.conftest import free_port
from tests.fuzz import corpus
from tests.fuzz.compare import describe, verdict
from tests.fuzz.grammar import Case, cases
from tests.fuzz.logs import LogWatch
from tests.fuzz.servers import Servers, deploy_echo, uvicorn_echo


class Found(AssertionError):
    """A case the toolkit fails, with the outcomes' description."""

    def __init__(self, case: Case, what: str) -> None:
        super().__init__(what)
        self.case = case


def search(servers: Servers, logs: LogWatch, batch: int, at_seed: int, counted: list[int]) -> Found | None:
    """Up to ``batch`` cases from ``at_seed``; the shrunk failure, if one was found."""
    failures: list[Found] = []

    @seed(at_seed)
    @settings(max_examples=batch, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(cases())
    def same_as_uvicorn(case: Case) -> None:
        counted[0] += 1
        wrong, outcomes = verdict(servers, case)
        tracebacks = logs.tracebacks()
        if wrong is None and tracebacks:
            wrong = f"a traceback in the toolkit's logs ({tracebacks[0].splitlines()[-1]})"
        if wrong is not None:
            failures.append(Found(case, f"{wrong}: {describe(case, outcomes)}"))
            raise failures[-1]

    try:
        same_as_uvicorn()
    except Exception:  # Found, or hypothesis's Flaky* when a replay passed (a slow log)
        if not failures:
            raise
        return failures[-1]  # hypothesis replays the shrunk case last
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch", type=int, default=500, help="cases per seed")
    args = parser.parse_args()
    port = free_port()
    tk.start(backend="ray", http_options={"host": "127.0.0.1", "port": port, "access_log": False})
    apps = deploy_echo("fuzz")
    uvicorn_port = free_port()
    counted, found, at_seed = [0], 0, args.seed
    started = time.monotonic()
    try:
        with uvicorn_echo(uvicorn_port), ThreadPoolExecutor(2) as pool:
            servers, logs = Servers(uvicorn_port, port, pool), LogWatch(apps)
            while time.monotonic() - started < args.minutes * 60:
                failure = search(servers, logs, args.batch, at_seed, counted)
                if failure is not None:
                    found += 1
                    print(f"seed {at_seed}: {failure}", flush=True)
                    corpus.add(f"found-seed-{at_seed}", failure.case, str(failure).split(":", 1)[0])
                at_seed += 1
    finally:
        tk.shutdown()
    minutes = (time.monotonic() - started) / 60
    print(
        f"{counted[0]} cases in {minutes:.1f} min ({counted[0] / minutes:.0f} per minute), "
        f"seeds {args.seed}..{at_seed - 1}, {found} failures (added to {corpus.CORPUS.name})"
    )


if __name__ == "__main__":
    main()
