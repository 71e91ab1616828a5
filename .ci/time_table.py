"""CONTRIBUTING.md's time table from a pytest run's JUnit XML: each folder's time and
CPU (summed over tests; the workers run them side by side) and the costliest tests.

    python .ci/time_table.py .venv/pytest.xml [--slowest 15]

A test's time is its wall time, which grows with what the other workers do beside it;
its CPU (tests/cpu_meter.py: the test process's and every process it started) much less,
so the tests are ranked by CPU, what the suite's two cores spend on them (by time, in an
XML written before the suite recorded CPU).
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from dataclasses import dataclass


@dataclass(frozen=True)
class Test:
    """One test's id, wall time and CPU (0 when the XML has none)."""

    name: str
    seconds: float
    cpu_s: float


def read(path: str) -> list[Test]:
    """The tests of a JUnit XML file."""
    tests = []
    for case in ET.parse(path).iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        cpu = {p.get("name"): p.get("value") for p in case.iter("property")}.get("cpu_s", "0")
        tests.append(Test(f"{module}::{case.get('name')}", float(case.get("time", 0)), float(cpu or 0)))
    return tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml")
    parser.add_argument("--slowest", type=int, default=15)
    options = parser.parse_args()
    tests = read(options.xml)
    folders: dict[str, list[Test]] = collections.defaultdict(list)
    for test in tests:
        parts = test.name.split("/")
        folders["/".join(parts[:2]) + "/" if len(parts) > 2 else test.name.partition("::")[0]].append(test)
    print("| folder | tests | time (s, summed) | CPU (s, summed) |\n| --- | ---: | ---: | ---: |")

    def cost(item: tuple[str, list[Test]]) -> tuple[float, float]:
        return -sum(t.cpu_s for t in item[1]), -sum(t.seconds for t in item[1])

    for folder, members in sorted(folders.items(), key=cost):
        seconds, cpu = sum(t.seconds for t in members), sum(t.cpu_s for t in members)
        print(f"| `{folder}` | {len(members)} | {seconds:.0f} | {cpu:.0f} |")
    print(f"| all | {len(tests)} | {sum(t.seconds for t in tests):.0f} | {sum(t.cpu_s for t in tests):.0f} |")
    print("\n| test | CPU (s) | time (s) |\n| --- | ---: | ---: |")
    for test in sorted(tests, key=lambda t: (-t.cpu_s, -t.seconds))[: options.slowest]:
        print(f"| `{test.name}` | {test.cpu_s:.1f} | {test.seconds:.1f} |")


if __name__ == "__main__":
    main()
