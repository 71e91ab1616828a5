"""Shared fixtures: one toolkit per backend per test session, real HTTP on 127.0.0.1.

Behaviour tests take the ``toolkit`` fixture and run on both backends. Tests are ordered
so every local-backend test runs before the Ray ones: each backend starts once.
"""

from __future__ import annotations

import os
import random
import secrets
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
# Ray worker processes import test apps (tests.apps.*) and examples by module path.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.pop("RAY_ADDRESS", None)
# The de-quantized copies of GGUF models (llm/engines/gguf_cache.py) in the venv running
# the tests, shared by its workers and runs, not in the user's cache; a clean clone starts
# without one.
os.environ.setdefault("APP_TOOLKIT_GGUF_CACHE", str(Path(sys.prefix) / "gguf-cache"))
# tests/vllm/ runs on vLLM, in a venv of its own (make test-vllm, with --noconftest).
collect_ignore = ["vllm"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import app_toolkit as tk  # noqa: E402
from app_toolkit._runtime.backends.base import current_session  # noqa: E402
from app_toolkit._runtime.backends.ray.cluster import SPARES_ENV  # noqa: E402
from tests import plain_http  # noqa: E402
from tests.cpu_meter import CpuMeter  # noqa: E402
from tests.leftovers import mark_this_process, stop_leftovers  # noqa: E402
from tests.redis_server import redis_server  # noqa: E402

#: Every process this test session starts carries this mark (tests/leftovers.py); set in
#: pytest_configure, so a process that merely imports this module marks nothing.
_OWNER = ""
_METER: CpuMeter | None = None
#: How long Ray's processes may take to end after ray.shutdown() (which does not wait for
#: them) before they count as left behind: generous, on a loaded 2-core host.
_LEFTOVER_GRACE_S = 30.0


def pytest_configure(config: pytest.Config) -> None:
    global _OWNER
    _OWNER = mark_this_process()


_CPU_AT_SETUP = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _METER
    if _METER is None:  # started by the first test: pytest-xdist's controller runs none
        _METER = CpuMeter(_OWNER)
    item.stash[_CPU_AT_SETUP] = _METER.seconds()


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """Each test's CPU (its set-up, call and teardown, in every process this session
    started: tests/cpu_meter.py) beside its time in the JUnit XML, which takes a test's
    properties from its teardown report."""
    if call.when == "teardown" and _METER is not None and _CPU_AT_SETUP in item.stash:
        item.user_properties.append(("cpu_s", f"{_METER.seconds() - item.stash[_CPU_AT_SETUP]:.2f}"))


#: Custom Ray resource of the test cluster, to check ray_actor_options reach Ray.
TEST_RESOURCE = "test_accelerator"


def free_port() -> int:
    """A free port below the kernel's ephemeral range. Between choosing a port and a
    server binding it, tests start Ray, whose processes bind ephemeral ports: one of them
    could take a port the kernel had just handed out for the asking (seen once: the test
    session's proxy could not listen, and every Ray test errored)."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    candidates = list(range(20_000, low))
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # no such range here: any free port
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Toolkit:
    """The running toolkit of one backend, and the apps one test deployed on it."""

    def __init__(self, backend: str, port: int) -> None:
        self.backend = backend
        self.url = f"http://127.0.0.1:{port}"
        self._apps: list[str] = []

    def name(self) -> str:
        return "t" + uuid.uuid4().hex[:8]

    def run(self, app: tk.Application, *, name: str | None = None, **kwargs: Any) -> tk.DeploymentHandle:
        name = name or self.name()
        self._apps.append(name)
        return tk.run(app, name=name, backend=self.backend, **kwargs)

    def run_many(self, targets: list[tk.RunTarget], **kwargs: Any) -> list[tk.DeploymentHandle]:
        """``tk.run_many`` on this backend; each target names its application."""
        for target in targets:
            assert target.name, "name each target: the test deletes its applications by name"
            self._apps.append(target.name)
        return tk.run_many(targets, backend=self.backend, **kwargs)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(**{"base_url": self.url, "timeout": 30, "verify": plain_http.TLS, **kwargs})

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(**{"base_url": self.url, "timeout": 30, "verify": plain_http.TLS, **kwargs})

    def cleanup(self) -> None:
        for name in self._apps:
            if name in tk.status().applications:
                tk.delete(name)
        self._apps.clear()


_ports: dict[str, int] = {}
#: max_request_body_bytes of the Ray test session's proxies and fronts.
LARGE_BODY_LIMIT = 2 << 30


#: The spare replica processes the session's Ray clusters keep (backends/ray/spares.py):
#: none. A spare hides a new replica's process start from a later scale-up; in a suite
#: whose tests deploy and delete within seconds, each spare started is a Ray worker
#: (0.7-1.5 s of a core, by host) that no later scale-up needed. The tests of spares run
#: on a cluster with the default setting (``spares_ray_toolkit``), after every other Ray
#: test (``pytest_collection_modifyitems``). A value set before the session wins.
_SESSION_SPARES = os.environ.setdefault(SPARES_ENV, "0")  # the CLI's clusters too
#: Ray's token authentication (on by default for the clusters ``ray.init()`` starts, Ray
#: 2.59 on) takes its token from here, not ~/.ray/auth_token: a worker's clusters and the
#: CLIs and scenarios it starts share it, nothing is written to the user's home, and
#: workers that start Ray at the same moment on a host without that file cannot each
#: write a different token into it (a CLI would read the other's and be refused).
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
#: The setting the running test cluster was started with (a Ray cluster's processes
#: inherit it when it starts: changing it means a new cluster).
_cluster_spares: str | None = None


def _ensure_backend(backend: str, spares: str = _SESSION_SPARES) -> Toolkit:
    global _cluster_spares
    if backend == "ray" and _cluster_spares != spares:
        _shut_down()  # a cluster with the other setting, or one this fixture did not start
    session = current_session(create=False)
    if session is not None and session.backend_name != backend:
        tk.shutdown()
        session = None
    port = _ports.setdefault(backend, free_port())
    if session is None:
        if backend == "ray":
            _init_test_ray(spares)
            _cluster_spares = spares
        # The Ray proxy's access log would print every test request to the console; the
        # local backend keeps it on (its records stay in this process, for caplog). On
        # Ray, bodies up to 2 GiB are allowed: a 1 GiB upload streams into an app
        # (test_direct_ingress.py).
        http: dict[str, object] = {"host": "127.0.0.1", "port": port, "access_log": backend == "local"}
        if backend == "ray":
            http["max_request_body_bytes"] = LARGE_BODY_LIMIT
        tk.start(backend=backend, http_options=http)
    return Toolkit(backend, port)


def _init_test_ray(spares: str) -> None:
    from app_toolkit._runtime.backends.ray.cluster import init_ray

    # The cluster's processes inherit the setting as Ray starts them ("": the default);
    # the clusters CLIs and scenarios start later keep the session's. Only this one
    # variable is put back: what init_ray and ray.init() set stays for the session, as it
    # does in a user's program (RAY_AUTH_MODE=token: the CLIs need it to join).
    before = os.environ.get(SPARES_ENV, _SESSION_SPARES)
    os.environ[SPARES_ENV] = spares
    try:  # the embedded cluster users get, with a resource to check ray_actor_options by
        init_ray(None, num_cpus=2, resources={TEST_RESOURCE: 2})
    finally:
        os.environ[SPARES_ENV] = before


def _toolkit_for(backend: str, spares: str = _SESSION_SPARES) -> Iterator[Toolkit]:
    kit = _ensure_backend(backend, spares)
    try:
        yield kit
    finally:
        kit.cleanup()


@pytest.fixture(params=["local", "ray"])
def toolkit(request: pytest.FixtureRequest) -> Iterator[Toolkit]:
    """The toolkit on each backend; apps a test deploys are deleted after it."""
    yield from _toolkit_for(request.param)


@pytest.fixture(scope="module", params=["local", "ray"])
def module_toolkit(request: pytest.FixtureRequest) -> Iterator[Toolkit]:
    """The toolkit on each backend for a whole module: what its tests share (one deploy
    they only read from) is deployed once per backend and deleted after its last test.
    Test ids read ``[local]`` and ``[ray]`` as with ``toolkit``."""
    yield from _toolkit_for(request.param)


@pytest.fixture(scope="module", params=["ray"])
def module_ray_toolkit(request: pytest.FixtureRequest) -> Iterator[Toolkit]:
    """``module_toolkit`` on Ray only."""
    yield from _toolkit_for(request.param)


@pytest.fixture(params=["ray"])
def spares_ray_toolkit(request: pytest.FixtureRequest) -> Iterator[Toolkit]:
    """``ray_toolkit`` on a cluster whose nodes keep spare replica processes as users'
    do (the default setting; the session's clusters keep none): for the tests of spares,
    which run after every other Ray test and share that cluster."""
    yield from _toolkit_for(request.param, spares="")


@pytest.fixture
def no_backend() -> Iterator[None]:
    """For tests that bring their own backend (TestClient): stop the shared one first."""
    if current_session(create=False) is not None:
        tk.shutdown()
    yield


@pytest.fixture
def local_toolkit() -> Iterator[Toolkit]:
    """The toolkit on the local backend only (to read the proxy's logs in this process)."""
    yield from _toolkit_for("local")


@pytest.fixture(params=["ray"])  # "[ray]" in the test's id, as for toolkit's Ray half
def ray_toolkit(request: pytest.FixtureRequest) -> Iterator[Toolkit]:
    """The toolkit on Ray only (actor death, CLI against the cluster, resources)."""
    yield from _toolkit_for(request.param)


def _on_ray(nodeid: str) -> bool:
    """Whether a test runs on Ray, as its id says (``test_x[ray]``, ``test_y[ray-ctrl-c]``):
    the toolkit and ray_toolkit fixtures name the backend there, and so do tests that
    start a Ray of their own."""
    params = nodeid.rpartition("[")[2].rstrip("]") if nodeid.endswith("]") else ""
    return "ray" in params.split("-")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every local-backend test before the Ray ones: each backend starts once per process.
    # Under pytest-xdist (`make test` runs -n 3) each worker still runs its tests in this
    # order (its load scheduling hands them out so), and starts a Ray cluster of its own.
    # The tests of spares come last: a worker that runs one starts its second cluster (the
    # default spare setting) once, and never goes back.
    items.sort(key=lambda item: (_on_ray(item.nodeid), "spares_ray_toolkit" in _fixtures(item)))
    for item in items:
        if _on_ray(item.nodeid):
            item.add_marker(pytest.mark.ray)


def _fixtures(item: pytest.Item) -> tuple[str, ...]:
    return tuple(getattr(item, "fixturenames", ()))


def _shut_down() -> None:
    global _cluster_spares
    try:
        if current_session(create=False) is not None:
            tk.shutdown()
    finally:
        if "ray" in sys.modules:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        _cluster_spares = None


@pytest.fixture(scope="session", autouse=True)
def _no_process_left_behind() -> Iterator[None]:
    """After the session's last test (this fixture is torn down last): the backends shut
    down, then no process this test process started may still run. What does is killed by
    PID and fails the run (reported as an error in the last test's teardown), so a test
    that timed out cannot leave its cluster running after the job."""
    yield
    try:
        _shut_down()
    finally:  # a backend that failed to shut down is what this check is for
        left = stop_leftovers(_OWNER, _LEFTOVER_GRACE_S)
    assert not left, f"processes left running by this test session, now killed: {left}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _METER is not None:
        _METER.stop()
    _shut_down()  # a session that ran no test never set up the fixture above


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real redis-server of this test session on 127.0.0.1 (tests/redis_server.py)."""
    with redis_server() as server:
        yield server.url
