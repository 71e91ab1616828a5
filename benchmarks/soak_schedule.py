"""The soak's kill schedule: which kind of process dies when, drawn from a seed, printed,
and written as JSON so a later run can repeat it (``--replay``). Pure: no Ray, no clock."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

#: What the soak kills, one of each per round of the schedule.
KINDS = ("ingress", "model", "proxy", "controller", "node", "redis")


@dataclass(frozen=True, slots=True)
class PlannedKill:
    at_s: float  # seconds after the traffic started
    kind: str  # one of KINDS
    pick: float  # in [0, 1): which of the live targets of that kind (sorted), when it fires


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    duration_s: float
    kills: tuple[PlannedKill, ...]

    def counts(self) -> Counter[str]:
        return Counter(kill.kind for kill in self.kills)

    def to_json(self) -> str:
        return json.dumps(
            {"seed": self.seed, "duration_s": self.duration_s, "kills": [asdict(k) for k in self.kills]},
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        raw = json.loads(text)
        kills = tuple(PlannedKill(float(k["at_s"]), str(k["kind"]), float(k["pick"])) for k in raw["kills"])
        unknown = {kill.kind for kill in kills} - set(KINDS)
        if unknown:
            raise ValueError(f"a replayed schedule names kinds this soak does not kill: {sorted(unknown)}")
        return cls(int(raw["seed"]), float(raw["duration_s"]), kills)

    @classmethod
    def load(cls, path: str | Path) -> Schedule:
        return cls.from_json(Path(path).read_text())

    def describe(self) -> str:
        lines = [f"kill schedule (seed {self.seed}, {len(self.kills)} kills over {self.duration_s:.0f} s):"]
        lines += [f"  {kill.at_s:7.1f} s  {kill.kind:<10} pick {kill.pick:.3f}" for kill in self.kills]
        counts = self.counts()
        lines.append("  per kind: " + ", ".join(f"{kind} {counts[kind]}" for kind in KINDS))
        return "\n".join(lines)


#: What the last ``spare_last_s`` seconds of a schedule do not kill: the one-per-run
#: roles (the controller, the head node's proxy) then live long enough for the report's
#: RSS, fd and task figures (``--steady``); a worker node's kill still takes its proxy.
SPARED = ("controller", "proxy")


def make_schedule(
    seed: int,
    duration_s: float,
    kill_min_s: float = 10.0,
    kill_max_s: float = 30.0,
    kinds: tuple[str, ...] = KINDS,
    spare_last_s: float = 0.0,
) -> Schedule:
    """A kill every ``uniform(kill_min_s, kill_max_s)`` seconds, the kinds dealt in shuffled
    rounds (each round kills every kind once, so the kinds stay within one of each other);
    the last kill leaves ``kill_min_s`` before the end for the recovery to be seen. In the
    last ``spare_last_s`` seconds a kind of :data:`SPARED` drawn is replaced by another
    kind, drawn at random (the times and picks are those the seed makes without it)."""
    if not 0 < kill_min_s <= kill_max_s:
        raise ValueError(f"need 0 < kill_min_s <= kill_max_s, got {kill_min_s} and {kill_max_s}")
    if not 0 <= spare_last_s < duration_s:
        raise ValueError(f"need 0 <= spare_last_s < duration_s, got {spare_last_s} and {duration_s}")
    rng = random.Random(seed)
    instead = random.Random(f"{seed} spared")  # apart: the times and picks stay the seed's
    others = [kind for kind in kinds if kind not in SPARED]
    kills: list[PlannedKill] = []
    at = 0.0
    while True:
        round_ = list(kinds)
        rng.shuffle(round_)
        for kind in round_:
            at += rng.uniform(kill_min_s, kill_max_s)
            if at > duration_s - kill_min_s:
                return Schedule(seed, duration_s, tuple(kills))
            if kind in SPARED and at > duration_s - spare_last_s and others:
                kind = instead.choice(others)
            kills.append(PlannedKill(round(at, 3), kind, round(rng.random(), 6)))
