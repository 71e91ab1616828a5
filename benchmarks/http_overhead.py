"""HTTP overhead of app_toolkit against bare uvicorn, same route code, side by side.

Starts ``uvicorn benchmarks.bench_app:fastapi_app`` (one process, without its access
log) and the toolkit serving ``benchmarks.bench_app:app`` (embedded local Ray: proxy
actor + replica actor; default settings, so its access log is on) both ways users start
it: ``app-toolkit run`` and a Python script calling ``tk.run`` (``benchmarks/run_python.py``;
``--no-python-api`` leaves it out). Loads them all with wrk on 127.0.0.1, alternating,
and prints per scenario req/s, p50 and p99 latency, server CPU per request and each
toolkit's ratio to uvicorn (medians over rounds). ``--uvicorn-access-log`` adds a uvicorn
with its default access log to the same rounds, a second baseline; ``--production`` the
production baseline (that, plus a request id and Prometheus metrics per route:
``benchmarks/production_app.py``), the one a FastAPI developer compares with.

    python -m benchmarks.http_overhead [--duration 10] [--rounds 2] [--replicas 1]
        [--uvicorn-access-log] [--production] [--no-python-api]

Needs ``wrk`` (``make bench`` installs it). Ray Serve is not compared here: it is not
a dependency; its figures on these machines are quoted in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from app_toolkit.config.api_keys import key_hash, new_key
from benchmarks.proc_cpu import cpu_by_process, cpu_spent
from benchmarks.toolkit_modes import (
    BIN,
    CLI,
    KEYED,
    LABELS,
    PYTHON,
    add_mode_arguments,
    chosen_modes,
    describe,
    toolkit_command,
)

ROOT = Path(__file__).resolve().parents[1]

DONE_HOOK = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "JSON {\\"requests\\": %d, \\"duration_us\\": %d, \\"p50_us\\": %d, \\"p99_us\\": %d, "
    .. "\\"errors\\": %d, \\"non2xx\\": %d}\\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""


@dataclass(frozen=True)
class Scenario:
    name: str
    path: str
    connections: int
    method: str = "GET"
    body_bytes: int = 0


SCENARIOS = [
    Scenario("GET small JSON, c=1", "/small", 1),
    Scenario("GET small JSON, c=32", "/small", 32),
    Scenario("POST 1 KiB JSON echo, c=32", "/echo", 32, "POST", 1024),
    Scenario("GET sleep(10 ms), c=128", "/sleep", 128),
    Scenario("POST 1 MiB, c=8", "/upload", 8, "POST", 1 << 20),
]


@dataclass
class Result:
    rps: float
    p50_ms: float
    p99_ms: float
    failures: int
    requests: int = 0
    cpu_ms: float = 0.0  # the server's CPU (all its processes) per request
    #: The same per process label (``ReplicaActor``, ``raylet``, ...), in microseconds.
    cpu_us_by_process: dict[str, float] = field(default_factory=dict)


#: The second baseline's name (``--uvicorn-access-log``): uvicorn with its access log.
LOGGED = "uvicorn-log"
#: The production baseline: uvicorn with its access log serving the app with a request id
#: and Prometheus metrics per route (benchmarks/production_app.py).
PRODUCTION = "production"
#: What each baseline is, as the printed rows name it.
BASELINES = {LOGGED: "uvicorn with its access log", PRODUCTION: "production uvicorn (log, ids, metrics)"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(
    url: str, process: subprocess.Popen[bytes], timeout_s: float, headers: dict[str, str] | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before serving {url}")
        try:
            if httpx.get(url, headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def lua_script(scenario: Scenario, folder: Path, key: str = "") -> Path:
    """wrk's script for ``scenario``; ``key``: sent as ``Authorization: Bearer`` to every
    server (those without API keys ignore it), so all read the same bytes."""
    lines = [f'wrk.method = "{scenario.method}"']
    if key:
        lines.append(f'wrk.headers["Authorization"] = "Bearer {key}"')
    if scenario.body_bytes:
        if scenario.path == "/echo":
            filler = "x" * (scenario.body_bytes - len('{"data": ""}'))
            body = json.dumps({"data": filler})
        elif scenario.path.startswith("/embed"):
            body = json.dumps({"text": "batching turns many small requests into one pass " * 2})
        else:
            body = "x" * scenario.body_bytes
        body_file = folder / f"{scenario.path.strip('/').replace('/', '_')}.body"
        body_file.write_text(body)
        lines += [
            f'local f = io.open("{body_file}", "rb")',
            "wrk.body = f:read('*all')",
            "f:close()",
            'wrk.headers["Content-Type"] = "application/json"',
        ]
    script = folder / f"{scenario.path.strip('/').replace('/', '_')}.lua"
    script.write_text("\n".join(lines) + "\n" + DONE_HOOK)
    return script


def run_wrk(base: str, scenario: Scenario, script: Path, duration_s: int) -> Result:
    command = [
        "wrk",
        "-t1",
        f"-c{scenario.connections}",
        f"-d{duration_s}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        base + scenario.path,
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    line = next(line for line in output.splitlines() if line.startswith("JSON "))
    data = json.loads(line[5:])
    return Result(
        rps=data["requests"] / (data["duration_us"] / 1e6),
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        failures=data["errors"] + data["non2xx"],
        requests=data["requests"],
    )


def run_measured(
    server: subprocess.Popen[bytes], base: str, scenario: Scenario, script: Path, duration_s: int
) -> Result:
    """One wrk run, with the CPU the server's process tree spent per request (from /proc),
    in all and per process."""
    before = cpu_by_process(server.pid)
    result = run_wrk(base, scenario, script, duration_s)
    spent = cpu_spent(before, cpu_by_process(server.pid))
    requests = max(result.requests, 1)
    result.cpu_ms = sum(spent.values()) * 1000 / requests
    result.cpu_us_by_process = {label: seconds * 1e6 / requests for label, seconds in spent.items()}
    return result


def median(results: list[Result]) -> Result:
    return Result(
        rps=statistics.median(r.rps for r in results),
        p50_ms=statistics.median(r.p50_ms for r in results),
        p99_ms=statistics.median(r.p99_ms for r in results),
        failures=sum(r.failures for r in results),
        requests=sum(r.requests for r in results),
        cpu_ms=statistics.median(r.cpu_ms for r in results),
        cpu_us_by_process={
            label: statistics.median(r.cpu_us_by_process.get(label, 0.0) for r in results)
            for label in {label for r in results for label in r.cpu_us_by_process}
        },
    )


def start_servers(
    uvicorn_target: str,
    toolkit_target: str,
    ready_path: str,
    *,
    access_log: bool = True,
    toolkit_env: dict[str, str] | None = None,
    uvicorn_workers: int = 1,
    uvicorns: dict[str, bool] | None = None,
    uvicorn_targets: dict[str, str] | None = None,
    toolkit_modes: Sequence[str] = (CLI,),
    api_key: tuple[str, Path] | None = None,
) -> tuple[dict[str, subprocess.Popen[bytes]], dict[str, str]]:
    """Start bare uvicorn and the toolkit (embedded Ray) side by side; wait for them all.

    ``toolkit_modes``: how the toolkit is started, one server each
    (``benchmarks/toolkit_modes.py``): ``toolkit``, ``app-toolkit run`` (the default, and
    the only one unless asked), and ``toolkit-python``, a script calling ``tk.run``.
    The toolkit runs with its defaults: its access log on, written to /dev/null
    (``access_log=False`` turns it off). ``uvicorns``: the uvicorn servers to start, by
    name, each with its access log on or off (on: uvicorn's own default logging, its lines
    to /dev/null); by default one, ``uvicorn``, without an access log (the stricter
    baseline); ``uvicorn_targets`` gives a server another app than ``uvicorn_target``.
    ``toolkit_env``: more environment for the toolkit only. ``uvicorn_workers``:
    uvicorn's ``--workers``. ``api_key``: a key and the keys file of the ``toolkit-keys``
    mode (which is ready once it answers that key)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    uvicorns = uvicorns if uvicorns is not None else {"uvicorn": False}
    ports = {name: free_port() for name in (*uvicorns, *toolkit_modes)}
    servers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, logged in uvicorns.items():
            servers[name] = subprocess.Popen(
                [
                    str(BIN / "uvicorn"),
                    (uvicorn_targets or {}).get(name, uvicorn_target),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(ports[name]),
                    *([] if logged else ["--log-level", "warning", "--no-access-log"]),
                    *(["--workers", str(uvicorn_workers)] if uvicorn_workers > 1 else []),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL if logged else None,  # uvicorn's access lines
            )
        for mode in toolkit_modes:
            servers[mode] = subprocess.Popen(
                toolkit_command(
                    mode,
                    toolkit_target,
                    ports[mode],
                    access_log=access_log,
                    keys_file=api_key[1] if api_key else None,
                ),
                cwd=ROOT,
                env={**env, **(toolkit_env or {})},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL if access_log else None,  # the access log's lines
            )
        bases = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        for name, process in servers.items():
            headers = {"authorization": f"Bearer {api_key[0]}"} if api_key and name == KEYED else None
            wait_ready(bases[name] + ready_path, process, timeout_s=180, headers=headers)
    except BaseException:
        stop_servers(servers)
        raise
    return servers, bases


def stop_servers(servers: dict[str, subprocess.Popen[bytes]]) -> None:
    """Stop the servers this script started (by PID): Ctrl-C for the toolkit, either way
    it was started (each shuts its Ray down)."""
    for name, process in servers.items():
        if name in LABELS:
            process.send_signal(signal.SIGINT)
        else:
            process.terminate()
    for process in servers.values():
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def channel_tls_env(folder: Path) -> dict[str, str]:
    """Certificates from a throwaway CA, and the variables that turn TLS on."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    return {
        "APP_TOOLKIT_CHANNEL_TLS": "1",
        "APP_TOOLKIT_TLS_CERT": str(folder / "cert.pem"),
        "APP_TOOLKIT_TLS_KEY": str(folder / "key.pem"),
        "APP_TOOLKIT_TLS_CA": str(folder / "ca.pem"),
    }


def split_config(folder: Path) -> str:
    """A config file: the bench app twice, its traffic split 50/50 between them."""
    import yaml

    app = {"import_path": "benchmarks.bench_app:app"}
    config = {
        "applications": [
            {**app, "name": "bench", "route_prefix": "/", "traffic": {"bench": 50, "bench-b": 50}},
            {**app, "name": "bench-b", "route_prefix": None},
        ]
    }
    path = folder / "split.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def shadow_config(folder: Path) -> str:
    """A config file: the bench app, half its requests copied to a slow, flaky shadow."""
    import yaml

    config = {
        "applications": [
            {
                "name": "bench",
                "route_prefix": "/",
                "import_path": "benchmarks.bench_app:app",
                "shadow": {"to": "bench-shadow", "fraction": 0.5},
            },
            {"name": "bench-shadow", "route_prefix": None, "import_path": "benchmarks.bench_app:shadow"},
        ]
    }
    path = folder / "shadow.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def by_process(result: Result) -> str:
    """The processes that spent at least 1 us per request, most first."""
    spent = sorted(result.cpu_us_by_process.items(), key=lambda item: -item[1])
    return ", ".join(f"{label} {us:.1f} us" for label, us in spent if us >= 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per server and scenario")
    parser.add_argument(
        "--replicas",
        type=int,
        choices=(1, 2),
        default=1,
        help="ingress replicas; with 2, uvicorn runs with --workers 2 (what a FastAPI user would run)",
    )
    parser.add_argument(
        "--no-access-log",
        action="store_true",
        help="turn the toolkit's access log off (by default it is on, as users get it, and "
        "written to /dev/null; the first uvicorn runs without one either way)",
    )
    parser.add_argument(
        "--uvicorn-access-log",
        action="store_true",
        help="also run uvicorn as `uvicorn app:app` runs, with its access log (to /dev/null), "
        "as a second baseline in the same rounds (uvicorn-log); the first one runs with "
        "--no-access-log, the stricter baseline",
    )
    parser.add_argument(
        "--production",
        action="store_true",
        help="also run the production baseline in the same rounds: uvicorn with its access log "
        "serving the app with asgi-correlation-id and prometheus-fastapi-instrumentator "
        "(benchmarks/production_app.py; needs the bench extra)",
    )
    parser.add_argument(
        "--proxied",
        action="store_true",
        help="keep the ingress on the proxied path (direct_ingress=False: the proxy serves "
        "every connection and forwards each request), to compare with direct ingress",
    )
    parser.add_argument("--only", default="", help="run scenarios whose name contains this")
    parser.add_argument(
        "--per-process",
        action="store_true",
        help="also print the toolkit's CPU per request by process (replica, proxy, driver, "
        "Ray's own processes), medians over rounds",
    )
    parser.add_argument(
        "--api-keys",
        action="store_true",
        help="also run `app-toolkit run` with 100 API keys (--api-keys-file) in the same rounds, "
        "and send every server one of them (Authorization: Bearer): the key check's cost",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--channel-tls",
        action="store_true",
        help="run the toolkit's data plane over TLS (throwaway certificates; needs trustme)",
    )
    parser.add_argument(
        "--shadow",
        action="store_true",
        help="copy half the requests to a shadow that takes 1 s and fails every other request "
        "(compare the primary's p99 and failures with a run without it)",
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="split the traffic 50/50 between two applications of one replica each (compare "
        "with --replicas 2: the same replicas without a split)",
    )
    add_mode_arguments(parser)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: run `make bench` (it installs it) or `apt-get install wrk`")

    modes = chosen_modes(args) + ((KEYED,) if args.api_keys else ())
    target = "benchmarks.bench_app:" + ("app2" if args.replicas == 2 else "app")
    if args.proxied:
        target += "_proxied"
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as folder:
        if args.split:
            target = split_config(Path(folder))
        elif args.shadow:
            target = shadow_config(Path(folder))
        api_key = api_keys(Path(folder)) if args.api_keys else None
        print(describe(modes, target), flush=True)
        servers, bases = start_servers(
            "benchmarks.bench_app:fastapi_app",
            target,
            "/small",
            access_log=not args.no_access_log,
            toolkit_env=channel_tls_env(Path(folder)) if args.channel_tls else None,
            uvicorn_workers=args.replicas,
            uvicorns={
                "uvicorn": False,
                **({LOGGED: True} if args.uvicorn_access_log else {}),
                **({PRODUCTION: True} if args.production else {}),
            },
            uvicorn_targets={PRODUCTION: "benchmarks.production_app:app"},
            toolkit_modes=modes,
            api_key=api_key,
        )
        try:
            for scenario in SCENARIOS:
                if args.only and args.only not in scenario.name:
                    continue
                script = lua_script(scenario, Path(folder), api_key[0] if api_key else "")
                runs: dict[str, list[Result]] = {name: [] for name in servers}
                for name in runs:  # warm up every server
                    run_wrk(bases[name], scenario, script, 2)
                for _ in range(args.rounds):
                    for name in runs:
                        runs[name].append(
                            run_measured(servers[name], bases[name], scenario, script, args.duration)
                        )
                rows.append(report(scenario.name, {name: median(results) for name, results in runs.items()}))
                if args.per_process:
                    for mode in modes:
                        print(
                            f"{'':28} {LABELS[mode]} CPU per request by process: "
                            f"{by_process(median(runs[mode]))}",
                            flush=True,
                        )
        finally:
            stop_servers(servers)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


def api_keys(folder: Path, count: int = 100) -> tuple[str, Path]:
    """A keys file of ``count`` keys in ``folder``, and the one the clients send."""
    keys = [new_key() for _ in range(count)]
    keys_file = folder / "keys.yaml"
    keys_file.write_text("".join(f"- {{name: k{i}, hash: '{key_hash(k)}'}}\n" for i, k in enumerate(keys)))
    return keys[count // 2], keys_file


#: The prefix of each toolkit mode's keys in a JSON row.
_ROW_PREFIX = {CLI: "", PYTHON: "python_", KEYED: "keys_"}


def report(scenario: str, medians: dict[str, Result]) -> dict[str, object]:
    """Print one scenario's rows: bare uvicorn against each toolkit mode, then each other
    baseline against them; returns its results (the JSON row)."""
    bare = medians["uvicorn"]
    modes = [mode for mode in LABELS if mode in medians]
    print(
        f"{scenario:28} {'uvicorn':25} {bare.rps:8.0f} req/s p50 {bare.p50_ms:6.2f} ms "
        f"p99 {bare.p99_ms:7.2f} ms "
        f"| failures {bare.failures} | server CPU/request {bare.cpu_ms:.3f} ms",
        flush=True,
    )
    row: dict[str, object] = {"scenario": scenario, "uvicorn": vars(bare)}
    for mode in modes:
        ours = medians[mode]
        prefix = _ROW_PREFIX[mode]
        row.update({mode: vars(ours), f"{prefix}ratio": ours.rps / bare.rps})
        print(
            f"{'':28} {LABELS[mode]:25} {ours.rps:8.0f} req/s p50 {ours.p50_ms:6.2f} ms "
            f"p99 {ours.p99_ms:7.2f} ms | ratio {ours.rps / bare.rps:4.2f}x, "
            f"p50 {ours.p50_ms - bare.p50_ms:+.2f} ms, failures {ours.failures} | "
            f"server CPU/request {ours.cpu_ms:.3f} ms",
            flush=True,
        )
    if KEYED in medians and CLI in medians:
        keyed, plain = medians[KEYED], medians[CLI]
        if keyed.failures or plain.failures:  # (a 401 is a failure: wrk counts non-2xx)
            print(f"{'':28} API keys on / off: not compared, the runs had failures", flush=True)
        else:
            row["keys_ratio_to_toolkit"] = keyed.rps / plain.rps
            print(
                f"{'':28} API keys on / off: {keyed.rps / plain.rps:.3f}x req/s, "
                f"CPU/request {1000 * (keyed.cpu_ms - plain.cpu_ms):+.1f} us",
                flush=True,
            )
    for baseline, described in BASELINES.items():
        if baseline not in medians:
            continue
        other = medians[baseline]
        row[baseline] = vars(other)
        ratios = []
        for mode in modes:
            ours = medians[mode]
            prefix = _ROW_PREFIX[mode]
            ratio_key = "ratio_to_uvicorn_log" if baseline == LOGGED else f"ratio_to_{baseline}"
            row[prefix + ratio_key] = ours.rps / other.rps
            ratios.append(
                f"{LABELS[mode].removeprefix('toolkit ')} {ours.rps / other.rps:4.2f}x, "
                f"p50 {ours.p50_ms - other.p50_ms:+.2f} ms"
            )
        print(
            f"{'':28} {described} {other.rps:8.0f} req/s p50 {other.p50_ms:6.2f} ms p99 "
            f"{other.p99_ms:7.2f} ms | ratio {'; '.join(ratios)} | failures {other.failures} | "
            f"server CPU/request {other.cpu_ms:.3f} ms",
            flush=True,
        )
    return row


if __name__ == "__main__":
    main()
