"""The regression corpus: hand-written probes, and every case the fuzzer ever found
(``make fuzz`` appends them to ``corpus.jsonl``). Each entry runs whole and byte by byte."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fuzz.grammar import Case

CORPUS = Path(__file__).with_name("corpus.jsonl")


def entries() -> dict[str, Case]:
    """Every entry by name."""
    found: dict[str, Case] = {}
    for line in CORPUS.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            data = entry["data"].encode("latin-1")
            found[entry["name"]] = Case(data, (), entry.get("close_early", False), entry.get("requests", 1))
    return found


def add(name: str, case: Case, why: str) -> None:
    """Keep ``case`` (whole; the corpus runs every entry whole and byte by byte)."""
    entry = {"name": name, "why": why, "data": case.data.decode("latin-1"), "requests": case.requests}
    if case.close_early:
        entry["close_early"] = True
    with CORPUS.open("a") as corpus:
        corpus.write(json.dumps(entry) + "\n")
