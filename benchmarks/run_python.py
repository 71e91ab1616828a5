"""The toolkit started from a Python script, as a user's script starts it: ``tk.start``
with the HTTP options, ``tk.run`` for the app, serving until SIGINT or SIGTERM, then
``tk.shutdown``. The HTTP benchmarks run it as "toolkit (tk.run)" beside ``app-toolkit
run`` (``benchmarks/toolkit_modes.py`` builds both command lines, from the same options).

    python -m benchmarks.run_python IMPORT_PATH|CONFIG.yaml [--host H] [--port P]
        [--access-log | --no-access-log]

A config file (``http_overhead --split`` or ``--shadow``) is deployed as a script would
deploy the same applications: one ``tk.run`` per application, then its traffic split
(``tk.set_traffic``) and its shadow (``tk.shadow``); other keys are refused.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

import app_toolkit as tk

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: The keys of a config file's application this script deploys.
APPLICATION_KEYS = {"name", "route_prefix", "import_path", "traffic", "shadow"}


class Stop:
    """SIGINT and SIGTERM: noted while the toolkit starts and deploys (a process stopped
    half-way through starting Ray leaves its agents behind), KeyboardInterrupt once it
    serves, as ``tk.run(app, blocking=True)`` stops on Ctrl-C."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.serving = False
        self.install()

    def install(self) -> None:
        # Installed again after tk.start: ray.init puts a SIGTERM handler of its own in place.
        # (Installed first too: a process started in the background may ignore SIGINT.)
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if self.serving:
            raise KeyboardInterrupt


def load(import_path: str) -> Any:
    """``module:attribute``: what ``from module import attribute`` gives a script."""
    module, _, attribute = import_path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def deploy(target: str) -> None:
    """An import path with ``tk.run``; a config file's applications one ``tk.run`` each,
    then their traffic splits and shadows."""
    if not target.endswith((".yaml", ".yml")):
        tk.run(load(target))
        return
    import yaml

    config = yaml.safe_load(Path(target).read_text())
    if set(config) - {"applications"}:
        raise SystemExit(f"run_python deploys only a config file's applications, not {sorted(config)}")
    applications = config["applications"]
    for app in applications:
        if set(app) - APPLICATION_KEYS:
            raise SystemExit(f"run_python does not deploy {sorted(set(app) - APPLICATION_KEYS)}")
        tk.run(load(app["import_path"]), name=app["name"], route_prefix=app.get("route_prefix", "/"))
    for app in applications:
        if "traffic" in app:
            tk.set_traffic(app["name"], app["traffic"])
        if "shadow" in app:
            tk.shadow(app["name"], **app["shadow"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", metavar="IMPORT_PATH|CONFIG.yaml")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    stop = Stop()
    try:
        tk.start(http_options={"host": args.host, "port": args.port, "access_log": args.access_log})
        stop.install()
        if stop.received is None:
            deploy(args.target)
        stop.serving = True
        if stop.received is None:
            print(f"run_python: serving {args.target} at http://{args.host}:{args.port}", flush=True)
            while True:
                time.sleep(60)  # until a stop signal interrupts it
    except KeyboardInterrupt:
        pass
    finally:
        stop.serving = False  # a second signal is noted; the shutdown goes on
        tk.shutdown()
    print("run_python: stopped", flush=True)


if __name__ == "__main__":
    main()
