"""What carrying a reply's continuation state costs per token while nothing fails (#78),
measured directly, in process CPU time.

A model replica's piece now carries the ids of the tokens it read (``Delta.tokens``), made
as a new ``Delta`` per piece (before, a lone piece was sent as it was made); the piece
crosses to the ingress pickled by the channel's codec and is read there; the ingress keeps
it to continue the reply (``Continuation.keep``). Each is timed against the same work
without the state: the piece as it was, without its token ids, and no keeping. With one
token per piece (``stream_batching_interval_ms`` 0, the default) a piece is a token.
Medians of ``--rounds`` rounds of ``--calls`` calls each.

    .venv/bin/python -m benchmarks.continuation_cost
"""

from __future__ import annotations

import argparse
import pickle

from app_toolkit._runtime.backends.ray.codec import dumps
from app_toolkit._runtime.channel.flow import frame_cost
from app_toolkit._runtime.messages import DeploymentID, StreamContinuation, StreamItem
from app_toolkit._runtime.routing.continuations import Continuation
from app_toolkit.llm.events import Delta
from app_toolkit.llm.replica.reply_stream import _joined
from benchmarks.key_check import _per_call_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    calls, rounds = args.calls, args.rounds

    piece = Delta(text=" lighthouse", completion_tokens=17)
    carried = Delta(text=" lighthouse", completion_tokens=17, tokens=(28_411,))
    read = [28_411]

    def made_with_ids() -> object:
        return _joined([piece], [], 17, tuple(read))

    def made_as_before() -> object:
        return piece  # a lone piece without log-probabilities went as it was made

    with_ids, without = dumps(StreamItem(carried)), dumps(StreamItem(piece))
    rule = StreamContinuation("generate", 3, 1 << 62, 60.0, max_bytes=1 << 62)
    keeper = Continuation(rule, DeploymentID("app", "model"))
    cost = frame_cost(len(dumps(carried)))  # what the channel counts the piece (the bytes bound)
    rows = [
        (
            "piece made (replica)",
            _per_call_us(made_with_ids, calls, rounds),
            _per_call_us(made_as_before, calls, rounds),
        ),
        (
            "piece pickled (replica)",
            _per_call_us(lambda: dumps(StreamItem(carried)), calls, rounds),
            _per_call_us(lambda: dumps(StreamItem(piece)), calls, rounds),
        ),
        (
            "piece read (ingress)",
            _per_call_us(lambda: pickle.loads(with_ids), calls, rounds),
            _per_call_us(lambda: pickle.loads(without), calls, rounds),
        ),
        ("piece kept (ingress)", _per_call_us(lambda: keeper.keep(carried, cost), calls, rounds), 0.0),
    ]
    print(f"pickled piece: {len(with_ids)} bytes with its token id, {len(without)} without")
    print(f"{'step':<26}{'with the state':>16}{'without':>10}{'added':>10}  (µs per token)")
    total = 0.0
    for name, with_state, before in rows:
        total += with_state - before
        print(f"{name:<26}{with_state:>16.3f}{before:>10.3f}{with_state - before:>10.3f}")
    print(f"{'added per token':<26}{'':>26}{total:>10.3f}")


if __name__ == "__main__":
    main()
