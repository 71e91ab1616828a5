"""The two ways users start the toolkit, as the HTTP benchmarks start it: the command line
(``app-toolkit run module:app``) and the Python API from a script (``tk.run(app)``:
``benchmarks/run_python.py``). Both get the same target (an import path or a config
file) and HTTP options; each runs as one process whose tree holds the Ray it started
(GCS, raylet, the toolkit's actors), so ``benchmarks/proc_cpu.py`` measures both alike.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: The servers' names in the benchmarks' results (``toolkit``: as before this mode came).
CLI = "toolkit"
PYTHON = "toolkit-python"
#: ``app-toolkit run`` with API keys on (``--api-keys-file``): the key check's cost beside CLI.
KEYED = "toolkit-keys"
#: How the printed rows name each mode.
LABELS = {CLI: "toolkit (app-toolkit run)", PYTHON: "toolkit (tk.run)", KEYED: "toolkit (run, API keys)"}

BIN = Path(sys.executable).parent


def toolkit_command(
    mode: str,
    target: str,
    port: int,
    *,
    host: str = "127.0.0.1",
    access_log: bool = True,
    keys_file: Path | None = None,
) -> list[str]:
    """The command line that serves ``target`` (``module:app`` or a config file) on
    ``host:port`` the ``mode`` way, its access log on or off (``keys_file``: the API keys
    of the ``KEYED`` mode)."""
    options = ["--host", host, "--port", str(port), "--access-log" if access_log else "--no-access-log"]
    if mode == CLI:
        return [str(BIN / "app-toolkit"), "run", target, *options]
    if mode == KEYED:
        if keys_file is None:
            raise ValueError("the toolkit with API keys needs its keys file")
        return [str(BIN / "app-toolkit"), "run", target, *options, "--api-keys-file", str(keys_file)]
    if mode == PYTHON:
        # -m, not the file's path: the driver's process is labelled "python" in the
        # per-process figures, as the CLI's is.
        return [sys.executable, "-m", "benchmarks.run_python", target, *options]
    raise ValueError(f"no toolkit mode {mode!r}: {', '.join(LABELS)}")


def add_mode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-python-api",
        action="store_true",
        help="leave out the toolkit started from a Python script with tk.run "
        "(benchmarks/run_python.py); by default it runs beside `app-toolkit run` in the same rounds",
    )


def chosen_modes(args: argparse.Namespace) -> tuple[str, ...]:
    return (CLI,) if args.no_python_api else (CLI, PYTHON)


def describe(modes: tuple[str, ...], target: str) -> str:
    """One line: how each toolkit mode is started here."""
    how = {
        CLI: f"`app-toolkit run {target}`",
        PYTHON: f"a script: tk.start(http_options) + tk.run({target})",
        KEYED: f"`app-toolkit run {target} --api-keys-file keys.yaml` (100 keys)",
    }
    if target.endswith((".yaml", ".yml")):
        how[PYTHON] = "a script: one tk.run per application of the file, then tk.set_traffic / tk.shadow"
    return "; ".join(f"{LABELS[mode]}: {how[mode]}" for mode in modes)
