"""``make compat``: does the newest release of every dependency pass, caps lifted?

Resolves the newest releases pyproject.toml would allow without its caps (``.ci/locks.py
--uncapped``; the runtime and the test tools, not the example models), installs them in
``.venv-compat`` with uv, runs the contract tests and then the lowest job's tests on them,
and prints which packages moved past the lock and which contract broke. A cap can be
lifted (pyproject.toml, one line) when this says every test passed.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import locks  # .ci/ is not a package: imported from its folder

ROOT = locks.ROOT
VENV = ROOT / ".venv-compat"
#: Contract tests first: each names one assumption about one package's internals.
CONTRACTS = {
    "tests/unit/test_uvicorn_contract.py": "uvicorn (front/uvicorn_compat.py)",
    "tests/unit/test_ray_codec.py": "ray, fastapi (backends/ray/ray_compat.py, fastapi_compat.py)",
    "tests/unit/test_serve_schema_fields.py": "ray (Ray Serve's config schema)",
}


def _lowest_tests() -> list[str]:
    """The lowest job's test list, read from the Makefile (one home)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    found = re.search(r"^LOWEST_TESTS := (.+)$", text, re.MULTILINE)
    if found is None:
        sys.exit("Makefile has no LOWEST_TESTS")
    return found.group(1).split()


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    print("$", shlex.join(command), flush=True)
    return subprocess.run(command, cwd=ROOT, text=True, capture_output=True)


def _moved(uncapped: str) -> list[str]:
    locked = locks._pins((ROOT / ".ci" / "newest.txt").read_text())
    moved = []
    for name, line in locks._pins(uncapped).items():
        if locked.get(name) != line:
            moved.append(f"{locked.get(name, name + ' (new)')} -> {line.split('==')[1]}")
    return moved


def main() -> int:
    uv = locks.UV
    uncapped = locks.newest(uncapped=True, extras=("dev",))
    lock = VENV.with_suffix(".txt")
    lock.write_text(uncapped)
    moved = _moved(uncapped)
    print("Newer than .ci/newest.txt:", *(moved or ["nothing"]), sep="\n  ")
    for step in (
        (uv, "venv", "--quiet", "--allow-existing", "--python", sys.executable, str(VENV)),
        (uv, "pip", "install", "--quiet", "--python", str(VENV / "bin/python"), "-r", str(lock)),
        (uv, "pip", "install", "--quiet", "--python", str(VENV / "bin/python"), "--no-deps", "-e", "."),
    ):
        done = _run(*step)
        if done.returncode != 0:
            print(done.stdout, done.stderr)
            return 2
    python = str(VENV / "bin/python")
    broken: list[str] = []
    for path, package in CONTRACTS.items():
        done = _run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", path)
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        if done.returncode != 0:
            broken.append(f"{package}: {path}")
            print(*(failed or done.stdout.splitlines()[-20:]), sep="\n  ")
    done = _run(python, "-m", "pytest", "-q", "-n", "3", "-p", "no:cacheprovider", "-rfE", *_lowest_tests())
    print(done.stdout.splitlines()[-1] if done.stdout else done.stderr[-2000:])
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if failed:
        broken.append("behaviour: " + ", ".join(sorted({line.split("::")[0].split()[-1] for line in failed})))
        print(*failed, sep="\n  ")
    elif done.returncode != 0:  # no test run (5), a collection error, a crashed worker
        broken.append(
            f"the test run itself (pytest exit {done.returncode}): {done.stdout[-1500:]}{done.stderr[-1500:]}"
        )
    if broken:
        print("\nBroke on the newest releases:", *broken, sep="\n  ")
        return 1
    if moved:
        print("\nEverything passed on the newest releases: the caps in pyproject.toml can be lifted to them.")
    else:
        print("\nEverything passed; no release is newer than the lock, so no cap holds anything back.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
