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
every request (``Connection: close``: a TLS handshake per request); with ``--paced-ms N``
a third, keep-alive with each connection waiting N ms between requests, so that every
server runs at about the same rate, below what it can serve (at full load a slower
server batches more per wake-up, which changes its CPU per request apart from TLS). Printed per server:
req/s and server CPU per request (every process of its tree, from /proc), medians over
``--rounds``, also net of what the server spends idle (its tree's CPU per second with no
load, measured for ``--idle-s`` before the runs: the toolkit's Ray processes spend it
whatever the load, so at a lower request rate more of it falls on each request); then
what TLS adds per request, net of idle, to uvicorn, and to the toolkit against the proxied
path without TLS and against its default (direct ingress), with the ratio to uvicorn's.

    python -m benchmarks.https_cost [--duration 10] [--rounds 3] [--paced-ms 20] [--handshake]

``--handshake`` measures instead, in this process, the server's CPU for one TLS handshake
(memory BIOs, no sockets) with uvicorn's context (as ``uvicorn.Config`` makes it) and the
toolkit's (``ClientTLS.context`` behind ``ServedTLS``), median of 300 each.

Needs ``wrk`` built with OpenSSL (Debian's is).
"""

from __future__ import annotations

import argparse
import contextlib
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
from benchmarks.proc_cpu import cpu_by_process, cpu_spent
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


def idle_rate(process: subprocess.Popen[bytes], seconds: float) -> float:
    """CPU seconds per second ``process``'s tree spends with no load."""
    before = cpu_by_process(process.pid)
    time.sleep(seconds)
    return sum(cpu_spent(before, cpu_by_process(process.pid)).values()) / seconds


def closing_script(folder: Path) -> Path:
    """wrk's script for a new connection per request."""
    script = lua_script(SMALL, folder)
    closing = folder / "small_close.lua"
    closing.write_text('wrk.headers["Connection"] = "close"\n' + script.read_text())
    return closing


def paced_script(folder: Path, delay_ms: int) -> Path:
    """wrk's keep-alive script with each connection waiting ``delay_ms`` between requests."""
    script = lua_script(SMALL, folder)
    paced = folder / "small_paced.lua"
    paced.write_text(script.read_text() + f"\nfunction delay()\n  return {delay_ms}\nend\n")
    return paced


def handshake_cpu(server: ssl.SSLContext, client: ssl.SSLContext) -> float:
    """The server's CPU seconds for one handshake with ``client``, over memory BIOs."""
    client_in, client_out, server_in, server_out = (ssl.MemoryBIO() for _ in range(4))
    near = client.wrap_bio(client_in, client_out, server_hostname="127.0.0.1")
    far = server.wrap_bio(server_in, server_out, server_side=True)
    spent = 0.0
    for _ in range(10):  # a TLS 1.3 handshake takes two flights each way
        with contextlib.suppress(ssl.SSLWantReadError):
            near.do_handshake()
        server_in.write(client_out.read())
        started = time.process_time()
        try:
            far.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        spent += time.process_time() - started
        client_in.write(server_out.read())
        if done:
            with contextlib.suppress(ssl.SSLWantReadError):
                near.do_handshake()
            return spent
    raise RuntimeError("the handshake did not end")


def print_handshakes(folder: Path, client: ssl.SSLContext) -> None:
    from app_toolkit._runtime.front.https import ServedTLS
    from app_toolkit.config.client_tls import ClientTLS

    uvicorn_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # uvicorn.Config's, by default
    uvicorn_context.load_cert_chain(str(folder / "cert.pem"), str(folder / "key.pem"))
    uvicorn_context.set_ciphers("TLSv1")
    ours = ServedTLS(ClientTLS(str(folder / "cert.pem"), str(folder / "key.pem"), None)).context
    for name, context in (("uvicorn", uvicorn_context), ("toolkit", ours)):
        spent = statistics.median(handshake_cpu(context, client) for _ in range(300))
        print(f"{name}: {spent * 1e6:.0f} us of server CPU per handshake", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds to measure each server idle")
    parser.add_argument(
        "--paced-ms", type=int, default=0, help="also keep-alive, this long between a connection's requests"
    )
    parser.add_argument("--handshake", action="store_true", help="only one handshake's CPU, in process")
    args = parser.parse_args()
    if args.handshake:
        with tempfile.TemporaryDirectory() as name:
            print_handshakes(Path(name), write_certificate(Path(name)))
        return
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: run `make bench` (it installs it) or `apt-get install wrk`")
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        client = write_certificate(folder)
        scripts = {"keep-alive": lua_script(SMALL, folder), "new connection each": closing_script(folder)}
        if args.paced_ms:
            scripts[f"keep-alive, paced {args.paced_ms} ms"] = paced_script(folder, args.paced_ms)
        started: dict[str, tuple[subprocess.Popen[bytes], str, Server]] = {}
        try:
            for server in servers(folder):
                process, base = start(server, free_port(), client)
                started[server.name] = (process, base, server)
            time.sleep(5)  # the last one's start settles
            idle = {name: idle_rate(process, args.idle_s) for name, (process, _, _) in started.items()}
            print("idle CPU: " + ", ".join(f"{name} {rate * 1000:.0f} ms/s" for name, rate in idle.items()))
            for label, script in scripts.items():
                runs: dict[str, list[Result]] = {name: [] for name in started}
                for _, base, _ in started.values():  # warm up every server
                    run_wrk(base, SMALL, script, 2)
                for round_number in range(args.rounds):
                    order = list(started) if round_number % 2 == 0 else list(started)[::-1]
                    for server_name in order:
                        process, base, _ = started[server_name]
                        runs[server_name].append(run_measured(process, base, SMALL, script, args.duration))
                report(f"{SMALL.name}, {label}", runs, idle)
        finally:
            for process, _, server in started.values():
                stop(process, server.toolkit)


def report(scenario: str, runs: dict[str, list[Result]], idle: dict[str, float]) -> None:
    cpu = {name: statistics.median(r.cpu_ms for r in results) * 1000 for name, results in runs.items()}
    rps = {name: statistics.median(r.rps for r in results) for name, results in runs.items()}
    # Each run's own: its CPU per request less the idle CPU its rate puts on each request.
    net = {
        name: statistics.median(r.cpu_ms * 1000 - idle[name] * 1e6 / r.rps for r in results)
        for name, results in runs.items()
    }
    failures = {name: sum(r.failures for r in results) for name, results in runs.items()}
    print(scenario, flush=True)
    for name in runs:
        said = f"server CPU/request {cpu[name]:7.1f} us, net of idle {net[name]:7.1f} us"
        print(f"  {name:16} {rps[name]:8.0f} req/s | {said} | failures {failures[name]}")
    uvicorn_adds = net["uvicorn-tls"] - net["uvicorn"]
    print(f"  TLS adds per request (net of idle): uvicorn {uvicorn_adds:.1f} us", flush=True)
    for what, plain in (("the proxied path", "toolkit-proxied"), ("the default (direct ingress)", "toolkit")):
        adds = net["toolkit-tls"] - net[plain]
        ratio = adds / uvicorn_adds if uvicorn_adds > 0 else float("nan")
        print(
            f"  TLS adds per request: toolkit against {what} {adds:.1f} us ({ratio:.2f}x uvicorn's)",
            flush=True,
        )


if __name__ == "__main__":
    main()
