"""CONTRIBUTING.md's time table from a pytest run's JUnit XML: the time of each folder
(summed over tests; the workers run them side by side) and the slowest tests.

    python .ci/time_table.py .venv/pytest.xml [--slowest 15]
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml")
    parser.add_argument("--slowest", type=int, default=15)
    options = parser.parse_args()
    tests: list[tuple[float, str]] = []
    for case in ET.parse(options.xml).iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        tests.append((float(case.get("time", 0)), f"{module}::{case.get('name')}"))
    folders: dict[str, list[float]] = collections.defaultdict(list)
    for seconds, test in tests:
        parts = test.split("/")
        folders["/".join(parts[:2]) + "/" if len(parts) > 2 else test.partition("::")[0]].append(seconds)
    print("| folder | tests | time (s, summed) |\n| --- | ---: | ---: |")
    for folder, times in sorted(folders.items(), key=lambda item: -sum(item[1])):
        print(f"| `{folder}` | {len(times)} | {sum(times):.0f} |")
    print(f"| all | {len(tests)} | {sum(t for t, _ in tests):.0f} |")
    print("\n| test | time (s) |\n| --- | ---: |")
    for seconds, test in sorted(tests, reverse=True)[: options.slowest]:
        print(f"| `{test}` | {seconds:.1f} |")


if __name__ == "__main__":
    main()
