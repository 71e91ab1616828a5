"""What HTTPS adds to each request's server CPU: the toolkit against uvicorn, with the same
certificate (a throwaway CA's, RSA 2048 as ``trustme`` makes it), same app logic.

Five servers side by side, loaded with wrk on 127.0.0.1 in alternation:

- ``uvicorn`` and ``uvicorn-tls`` (``--ssl-certfile``/``--ssl-keyfile``): bare uvicorn
  (``--no-access-log``) serving ``benchmarks.bench_app:fastapi_app``;
- ``toolkit`` (``app-toolkit run benchmarks.bench_app:app``, defaults: direct ingress, its
  access log on, to /dev/null as uvicorn's would be off),
  ``toolkit-proxied`` (``app_proxied``: the proxy serves every request) and
  ``toolkit-tls`` (``app`` with ``--ssl-certfile``/``--ssl-keyfile``: under HTTPS the proxy
  ends TLS and serves every request, docs/security.md).

Two scenarios, GET small JSON at c=32: keep-alive connections, and a new connection for
every request (``Connection: close``: a TLS handshake per request). Printed per server:
req/s and server CPU per request (every process of its tree, from /proc), medians over
``--rounds``; then what TLS adds per request to uvicorn, and to the toolkit against the
same path without TLS (proxied) and against its default (direct ingress), with the ratio
to uvicorn's.

    python -m benchmarks.https_cost [--duration 10] [--rounds 3]

Needs ``wrk`` built with OpenSSL (Debian's is).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.http_overhead import Result, Scenario, free_port, lua_script, run_measured, run_wrk
from benchmarks.toolkit_modes import BIN

ROOT = Path(__file__).resolve().parents[1]
SMALL = Scenario("GET small JSON, c=32", "/small", 32)


@dataclass(frozen=True)
class Server:
    name: str
    command: list[str]
    tls: bool
    toolkit: bool


def servers(folder: Path) -> list[Server]:
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    tls = ["--ssl-certfile", cert, "--ssl-keyfile", key]

    def uvicorn(extra: list[str]) -> list[str]:
        quiet = ["--log-level", "warning", "--no-access-log"]
        return [str(BIN / "uvicorn"), "benchmarks.bench_app:fastapi_app", *quiet, *extra]

    def toolkit(target: str, extra: list[str]) -> list[str]:
        return [str(BIN / "app-toolkit"), "run", f"benchmarks.bench_app:{target}", *extra]

    return [
        Server("uvicorn", uvicorn([]), False, False),
        Server("uvicorn-tls", uvicorn(tls), True, False),
        Server("toolkit", toolkit("app", []), False, True),
        Server("toolkit-proxied", toolkit("app_proxied", []), False, True),
        Server("toolkit-tls", toolkit("app", tls), True, True),
    ]


def write_certificate(folder: Path) -> ssl.SSLContext:
    """A throwaway CA's certificate for 127.0.0.1 in ``folder``; a client context trusting it."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    return ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())


def start(server: Server, port: int, client: ssl.SSLContext) -> tuple[subprocess.Popen[bytes], str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    command = [*server.command, "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"{'https' if server.tls else 'http'}://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {process.returncode} before serving")
        try:
            if httpx.get(base + SMALL.path, verify=client, timeout=2).status_code == 200:
                return process, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"{server.name} not ready after 180 s")


def stop(process: subprocess.Popen[bytes], toolkit: bool) -> None:
    """Stop a server this script started (by PID): Ctrl-C for the toolkit (it shuts its Ray down)."""
    process.send_signal(signal.SIGINT if toolkit else signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def closing_script(folder: Path) -> Path:
    """wrk's script for a new connection per request."""
    script = lua_script(SMALL, folder)
    closing = folder / "small_close.lua"
    closing.write_text('wrk.headers["Connection"] = "close"\n' + script.read_text())
    return closing


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: run `make bench` (it installs it) or `apt-get install wrk`")
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        client = write_certificate(folder)
        scripts = {"keep-alive": lua_script(SMALL, folder), "new connection each": closing_script(folder)}
        started: dict[str, tuple[subprocess.Popen[bytes], str, Server]] = {}
        try:
            for server in servers(folder):
                process, base = start(server, free_port(), client)
                started[server.name] = (process, base, server)
            for label, script in scripts.items():
                runs: dict[str, list[Result]] = {name: [] for name in started}
                for _, base, _ in started.values():  # warm up every server
                    run_wrk(base, SMALL, script, 2)
                for round_number in range(args.rounds):
                    order = list(started) if round_number % 2 == 0 else list(started)[::-1]
                    for server_name in order:
                        process, base, _ = started[server_name]
                        runs[server_name].append(run_measured(process, base, SMALL, script, args.duration))
                report(f"{SMALL.name}, {label}", runs)
        finally:
            for process, _, server in started.values():
                stop(process, server.toolkit)


def report(scenario: str, runs: dict[str, list[Result]]) -> None:
    cpu = {name: statistics.median(r.cpu_ms for r in results) * 1000 for name, results in runs.items()}
    rps = {name: statistics.median(r.rps for r in results) for name, results in runs.items()}
    failures = {name: sum(r.failures for r in results) for name, results in runs.items()}
    print(scenario, flush=True)
    for name in runs:
        said = f"server CPU/request {cpu[name]:7.1f} us | failures {failures[name]}"
        print(f"  {name:16} {rps[name]:8.0f} req/s | {said}")
    uvicorn_adds = cpu["uvicorn-tls"] - cpu["uvicorn"]
    proxied_adds = cpu["toolkit-tls"] - cpu["toolkit-proxied"]
    default_adds = cpu["toolkit-tls"] - cpu["toolkit"]
    print(f"  TLS adds per request: uvicorn {uvicorn_adds:.1f} us", flush=True)
    for what, adds in (("the proxied path", proxied_adds), ("the default (direct ingress)", default_adds)):
        ratio = adds / uvicorn_adds if uvicorn_adds > 0 else float("nan")
        print(
            f"  TLS adds per request: toolkit against {what} {adds:.1f} us ({ratio:.2f}x uvicorn's)",
            flush=True,
        )


if __name__ == "__main__":
    main()
