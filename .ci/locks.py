"""Write the two locks CI installs from (docs/compatibility.md), with uv:

- ``.ci/newest.txt``: the newest release of every package pyproject.toml allows, for the
  main job (``make test`` installs with it as pip constraints, so a release on the index
  never turns an unrelated change red);
- ``.ci/lowest.txt``: the lowest release of every runtime dependency the ranges allow (uv's
  ``lowest-direct`` resolution), with the test tools at the newest releases that fit
  beside them, for the lowest job (``make test-lowest``).

``--uncapped`` writes the newest lock as if the caps (the ``<`` bounds of the packages
whose internals we use) were lifted: ``make compat`` runs the suite on it. ``--check
LOCK`` says whether this Python has what LOCK pins (every runtime dependency installed, at
the lock's version): a job that installed nothing, or something else, fails before its
tests.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEWEST = ROOT / ".ci" / "newest.txt"
LOWEST = ROOT / ".ci" / "lowest.txt"
PYTHON = "3.11"
UV = str(Path(sys.executable).with_name("uv"))  # the dev extra's, beside this Python
#: The extras ``make test`` installs.
EXTRAS = ("dev", "embeddings", "chat", "llm")
#: What the lowest job's tests import beyond the runtime (the Makefile's LOWEST_TESTS).
TEST_TOOLS = (
    "pytest",
    "pytest-xdist",
    "packaging",
    "jsonschema",
    "trustme",
    "python-multipart",
    "openai",
    "anyio",
    "pydantic-settings",
    "opentelemetry-sdk",
)
#: Held in the newest lock: the CPU build of torch 2.13.0 is what this host's pip
#: configuration supplies (a newer torch from the index is a CUDA build of several GB).
NEWEST_HELD = ("torch==2.13.0",)
#: Where the newest test tool does not work beside the lowest runtime: anyio's pytest
#: plugin before 4.16 (the newest that fits typing-extensions 4.12) imports CallSpec2,
#: which pytest 9.2 deprecates (an error in pytest's 9.x).
LOWEST_TOOL_LIMITS = ("pytest<9.2",)


def _uv(requirements: str, *args: str) -> str:
    """``uv pip compile`` of ``requirements`` (given on stdin: no file name in the lock)."""
    command = [UV, "pip", "compile", "-q", "--python-version", PYTHON, "-", *args]
    done = subprocess.run(command, cwd=ROOT, input=requirements, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"uv pip compile {' '.join(args)} of\n{requirements}failed:\n{done.stderr}")
    return done.stdout


def _pins(lock: str) -> dict[str, str]:
    """Package name (normalised) -> its ``name==version`` line."""
    found = {}
    for line in lock.splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line)
        if match:
            found[_normal(match.group(1))] = match.group(0)
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _runtime() -> list[str]:
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def _uncapped(requirement: str) -> str:
    """``requirement`` without its upper bounds."""
    name, _, rest = requirement.partition(">=")
    floor = rest.split(",")[0].split(";")[0].strip()
    return f"{name}>={floor}" if rest else requirement


def _compile(requirements: list[str], *options: str) -> str:
    return _uv("\n".join(requirements) + "\n", "--no-header", *options)


def newest(uncapped: bool, extras: tuple[str, ...] = EXTRAS) -> str:
    """The newest lock (its text), with ``extras`` (by default every one ``make test``
    installs)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [item for extra in extras for item in project["optional-dependencies"][extra]]
    runtime = [_uncapped(item) for item in _runtime()] if uncapped else _runtime()
    held = [item for item in NEWEST_HELD if any(item.split("==")[0] in line for line in wanted)]
    return _compile([*runtime, *wanted, *held], "--upgrade")


def lowest() -> str:
    """The lowest lock: the runtime's direct dependencies at the lowest releases the ranges
    allow, the test tools and everything else at the newest releases that fit beside them
    (a test tool's newest may need a newer runtime package: openai, typing-extensions)."""
    low = _pins(_compile(_runtime(), "--resolution", "lowest-direct"))
    direct = []
    for item in _runtime():
        head = re.match(r"([A-Za-z0-9._-]+)(\[[^\]]*\])?", item)
        assert head is not None, item  # every requirement starts with a name
        name, extras = head.groups()
        direct.append(low[_normal(name)].replace("==", f"{extras or ''}==", 1))
    return _compile([*direct, *TEST_TOOLS, *LOWEST_TOOL_LIMITS])


def check(lock: Path) -> None:
    """Exit non-zero unless every runtime dependency is installed at ``lock``'s version."""
    from importlib.metadata import PackageNotFoundError, version

    pins = _pins(lock.read_text())
    wrong = []
    for item in _runtime():
        name = _normal(re.split(r"[\[<>=!~; ]", item)[0])
        pinned = pins.get(name, "").partition("==")[2]
        try:
            installed = version(name).split("+")[0]  # a local build (torch's +cpu) is the release
        except PackageNotFoundError:
            installed = "not installed"
        if not pinned or installed != pinned:
            wrong.append(f"{name}: {installed}, {lock.name} has {pinned or 'nothing'}")
    if wrong:
        sys.exit(f"Not what {lock.name} pins:\n  " + "\n  ".join(wrong))
    print(f"{len(_runtime())} runtime dependencies as {lock.name} pins them")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--uncapped", metavar="FILE", help="write the uncapped newest lock to FILE only")
    parser.add_argument(
        "--check", metavar="LOCK", type=Path, help="check this Python's packages against LOCK"
    )
    args = parser.parse_args()
    if args.check:
        check(args.check)
        return
    if args.uncapped:
        Path(args.uncapped).write_text(newest(uncapped=True))
        return
    heading = "# Written by .ci/locks.py (make locks); CI installs from it. Do not edit.\n"
    newest_lock = newest(uncapped=False)
    NEWEST.write_text(heading + newest_lock)
    LOWEST.write_text(heading + lowest())
    print(f"wrote {NEWEST.relative_to(ROOT)} and {LOWEST.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
