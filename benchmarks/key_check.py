"""The API key check's CPU per request, measured directly (#77: at most 5 µs with 100 keys).

The front's whole check (``KeyRing.admits``: the headers' key read, hashed, looked up,
the name put in the scope and counted) for a right key, a wrong one, a malformed header
and none, with 100 keys in the options; and the header pass (``read_headers``) with and
without an ``Authorization`` line, which is where the key is read. Medians of
``--rounds`` rounds of ``--calls`` calls each, in process CPU time.

    .venv/bin/python -m benchmarks.key_check
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from app_toolkit._runtime.front.key_check import KeyRing
from app_toolkit._runtime.front.scope import read_headers
from app_toolkit.config import HTTPOptions
from app_toolkit.config.api_keys import APIKey, key_hash, new_key

#: A browser-like request's other headers.
_HEADERS = [
    (b"host", b"127.0.0.1:8000"),
    (b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36"),
    (b"accept", b"application/json"),
    (b"accept-encoding", b"gzip, deflate"),
    (b"connection", b"keep-alive"),
]


def _per_call_us(work: Callable[[], object], calls: int, rounds: int) -> float:
    results = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            work()
        results.append((time.process_time() - started) / calls * 1e6)
    return statistics.median(results)


def _checking(ring: KeyRing, headers: list[tuple[bytes, bytes]]) -> Callable[[], object]:
    read = read_headers({"headers": headers})
    scope: dict[str, object] = {}
    return lambda: ring.admits(scope, read, False)


def _reading(headers: list[tuple[bytes, bytes]]) -> Callable[[], object]:
    scope = {"headers": headers}
    return lambda: read_headers(scope)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    keys = [new_key() for _ in range(args.keys)]
    options = HTTPOptions(api_keys=tuple(APIKey(name=f"k{i}", hash=key_hash(k)) for i, k in enumerate(keys)))
    ring = KeyRing(options)
    presented = {
        "right key": [(b"authorization", b"Bearer " + keys[args.keys // 2].encode())],
        "wrong key": [(b"authorization", b"Bearer " + new_key().encode())],
        "malformed": [(b"authorization", b"Basic " + keys[0].encode())],
        "no key": [],
    }
    print(f"{args.keys} keys, {args.rounds} rounds of {args.calls:,} calls; µs of CPU per call (median)")
    for what, extra in presented.items():
        check = _per_call_us(_checking(ring, _HEADERS + extra), args.calls, args.rounds)
        print(f"  check, {what:10} {check:6.2f}")
    for what, extra in (("with a key", presented["right key"]), ("without", [])):
        read = _per_call_us(_reading(_HEADERS + extra), args.calls, args.rounds)
        print(f"  header pass, {what:10} {read:6.2f}")


if __name__ == "__main__":
    main()
