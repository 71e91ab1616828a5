"""What the soak prints and writes: requests per kind and outcome, kills per kind,
failures per rule, the unexplained ones in full, the intact share of the requests no
kill touched, and per role the RSS, file descriptors and asyncio tasks of the processes
that lived through enough of the run."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.soak_processes import ProcessSample, sample
from benchmarks.soak_rules import OUTCOMES, Kill, Record, Verdict, stalls
from benchmarks.soak_schedule import KINDS, Schedule


@dataclass
class Samples:
    """Process samples over the run: (monotonic time, pid -> sample)."""

    start: float
    taken: list[tuple[float, dict[int, ProcessSample]]] = field(default_factory=list)

    async def take(self) -> None:
        try:
            self.taken.append((time.monotonic(), await asyncio.to_thread(sample)))
        except Exception as exc:  # noqa: BLE001 - the controller may be away; the next one counts
            print(f"no process sample: {type(exc).__name__}: {exc}", flush=True)

    async def run(self, end: float, every_s: float) -> None:
        while time.monotonic() < end:
            await self.take()
            await asyncio.sleep(min(every_s, max(0.0, end - time.monotonic())))

    def steady(self, min_s: float) -> list[tuple[int, ProcessSample, ProcessSample, float]]:
        """(pid, first, last, seconds between) of every process alive at the last sample
        and sampled over ``min_s`` or more."""
        alive = set(self.taken[-1][1]) if self.taken else set()
        first: dict[int, tuple[float, ProcessSample]] = {}
        last: dict[int, tuple[float, ProcessSample]] = {}
        for at, taken in self.taken:
            for pid, found in taken.items():
                first.setdefault(pid, (at, found))
                last[pid] = (at, found)
        return sorted(
            ((pid, first[pid][1], last[pid][1], last[pid][0] - first[pid][0]) for pid in first
             if pid in alive and last[pid][0] - first[pid][0] >= min_s),
            key=lambda item: (item[1].role, item[1].name),
        )  # fmt: skip


def _at(record: Record, start: float) -> dict[str, Any]:
    found = asdict(record)
    found["start"], found["end"] = round(record.start - start, 3), round(record.end - start, 3)
    found["cuts"] = [round(at - start, 3) for at in record.cuts]
    return found


def print_summary(
    verdict: Verdict,
    records: list[Record],
    kills: list[Kill],
    samples: Samples,
    steady_s: float,
    start: float,
) -> None:
    print("\nrequests per kind:")
    print(f"  {'kind':<11}" + "".join(f"{outcome:>12}" for outcome in OUTCOMES))
    for kind, outcomes in sorted(verdict.per_kind.items()):
        print(f"  {kind:<11}" + "".join(f"{outcomes[outcome]:>12}" for outcome in OUTCOMES))
    made = Counter(kill.kind for kill in kills)
    print("kills made: " + ", ".join(f"{kind} {made[kind]}" for kind in KINDS))
    print("failures explained, per rule:")
    for rule, count in verdict.per_rule.most_common():
        print(f"  {count:6}  {rule}")
    print(f"unexplained: {len(verdict.unexplained)}")
    for record in verdict.unexplained[:50]:
        print(f"  {_at(record, start)}")
    for kill in kills:
        touched = [r for r in verdict.unexplained if kill.started <= r.end and r.start <= kill.ended + 1]
        if touched:
            print(f"  (near the {kill.kind} kill at {kill.started - start:.1f} s: {len(touched)} of them)")
    print(f"corrupted or repeated stream data: {len(verdict.corrupt)}")
    print(f"resets while the node's proxy lived: {len(verdict.resets_while_proxy_lived)}")
    print(
        f"requests not in flight at a kill: {verdict.calm}, intact {verdict.calm_intact} "
        f"({verdict.calm_intact_share * 100:.2f} %, budget >= 95 %)"
    )
    print("streamed LLM replies' longest stall, met by a kill of a replica of their model / no kill:")
    for engine, row in stalls(records, kills).items():
        print(
            f"  {engine:<24} {row['met_replies']:5} replies p50 {row['met_p50_s']:6.2f} s  "
            f"p99 {row['met_p99_s']:6.2f} s  max {row['met_max_s']:6.2f} s  /  {row['calm_replies']:5} "
            f"replies p50 {row['calm_p50_s']:6.2f} s  p99 {row['calm_p99_s']:6.2f} s"
        )
    steady = samples.steady(steady_s)
    print(f"processes alive >= {steady_s:.0f} s, first -> last sample (RSS MB, fds, asyncio tasks):")
    if not steady:
        print("  none")
    for _pid, first, last, seconds in steady:
        growth = (last.rss_mb - first.rss_mb) / first.rss_mb * 100 if first.rss_mb else 0.0
        print(
            f"  {first.role:<15} {first.name[:40]:<40} {seconds:6.0f} s  RSS {first.rss_mb:6.0f} -> "
            f"{last.rss_mb:6.0f} ({growth:+5.1f} %)  fds {first.fds:4} -> {last.fds:4}  "
            f"tasks {first.tasks:4} -> {last.tasks:4}"
        )
    print("PASS" if verdict.passed() else "FAIL")


def report(
    args: argparse.Namespace,
    schedule: Schedule,
    verdict: Verdict,
    records: list[Record],
    kills: list[Kill],
    samples: Samples,
    start: float,
) -> dict[str, Any]:
    return {
        "arguments": vars(args),
        "schedule": {"seed": schedule.seed, "kills": [asdict(kill) for kill in schedule.kills]},
        "kills": [
            {
                **asdict(kill),
                "started": round(kill.started - start, 3),
                "ended": round(kill.ended - start, 3),
                "recovered": round(kill.recovered - start, 3) if kill.recovered else None,
            }
            for kill in kills
        ],
        "requests": {kind: dict(outcomes) for kind, outcomes in verdict.per_kind.items()},
        "per_rule": dict(verdict.per_rule),
        "unexplained": [_at(record, start) for record in verdict.unexplained],
        "corrupt": len(verdict.corrupt),
        "resets_while_proxy_lived": [_at(record, start) for record in verdict.resets_while_proxy_lived],
        "calm": verdict.calm,
        "calm_intact": verdict.calm_intact,
        "stalls": stalls(records, kills),
        "processes": [
            {"pid": pid, "seconds": round(seconds), "first": asdict(first), "last": asdict(last)}
            for pid, first, last, seconds in samples.steady(args.steady)
        ],
        "passed": verdict.passed(),
    }
