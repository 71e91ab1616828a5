"""Fault injection on a real local Ray cluster: a replica process SIGKILLed under load."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray

import app_toolkit as tk
from app_toolkit._runtime.backends.ray import stored
from app_toolkit._runtime.backends.ray.cluster import CONTROLLER_NAME, NAMESPACE, replica_actor
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.tables import APPLICATIONS_KEY, ApplicationTable, ReplicaTable, replicas_key
from tests import plain_http
from tests.apps import basic, hung, streams
from tests.conftest import Toolkit
from tests.waiting import wait_for

WORKERS = 8


@dataclass(frozen=True)
class Outcome:
    at: float
    status: int  # 0: no response (timeout or broken connection)
    retry_after: str | None
    error: str = ""  # the client's exception, with status 0


#: Both request paths: the ingress replica owns the client's connection (direct, the
#: default), or the proxy serves it and forwards each request (direct_ingress=False).
PATHS = pytest.mark.parametrize("direct", [True, False], ids=["direct", "proxied"])


@PATHS
def test_a_replica_killed_under_load_fails_only_its_running_requests(
    ray_toolkit: Toolkit, direct: bool
) -> None:
    name = ray_toolkit.name()
    app = basic.make_versioned_app(
        "v1", num_replicas=2, health_check_period_s=0.5, health_check_timeout_s=2, direct_ingress=direct
    )
    ray_toolkit.run(app, name=name, route_prefix="/kill")

    def replicas() -> list[tk.ReplicaStatusInfo]:
        return tk.status().applications[name].deployments["Ingress"].replicas

    victim = replicas()[0].replica_id
    actor = replica_actor(victim)
    pid = ray.get(actor.stats.remote(), timeout=30)["pid"]
    outcomes: list[Outcome] = []
    stop = threading.Event()

    async def load() -> None:
        async with ray_toolkit.async_client(timeout=10) as client:

            async def worker() -> None:
                while not stop.is_set():
                    try:
                        response = await client.get("/kill/version", params={"seconds": 0.05})
                        outcomes.append(
                            Outcome(
                                time.monotonic(), response.status_code, response.headers.get("retry-after")
                            )
                        )
                    except httpx.HTTPError as exc:
                        outcomes.append(Outcome(time.monotonic(), 0, None, type(exc).__name__))

            await asyncio.gather(*(worker() for _ in range(WORKERS)))

    loader = threading.Thread(target=lambda: asyncio.run(load()))
    loader.start()
    try:
        wait_for(lambda: len(outcomes) >= 50, 20, "the load to get going")
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # a process this test's deployment started

        def replaced() -> bool:
            current = replicas()
            ids = {r.replica_id for r in current}
            return victim not in ids and sum(r.state is tk.ReplicaState.RUNNING for r in current) == 2

        wait_for(replaced, 30, f"a replacement of {victim}")
        replaced_at = time.monotonic()
        # A second later every caller has the new table: from then on nothing fails.
        wait_for(
            lambda: sum(o.at > replaced_at + 1 for o in outcomes) >= 100,
            20,
            "load to go on after the replacement",
        )
    finally:
        stop.set()
        loader.join(timeout=30)
    failed = [o for o in outcomes if o.status != 200]
    # On both paths, no reset and no hang: those the replica had are 502 (they may have
    # run: no Retry-After), those it never ran are 503 with Retry-After. (Direct: the
    # proxy keeps a copy of every connection it handed over and answers for it.)
    assert all((o.status, o.retry_after) in ((502, None), (503, "1")) for o in failed), failed
    assert len(failed) <= WORKERS  # at most the requests that were running on it
    after = [o for o in outcomes if o.at > replaced_at + 1]
    assert after and all(o.status == 200 for o in after)
    print(
        f"replacement serving {replaced_at - killed_at:.2f} s after SIGKILL; "
        f"{len(failed)} of {len(outcomes)} requests answered 502/503 ({'direct' if direct else 'proxied'})"
    )


def test_a_killed_proxy_is_restarted_and_relearns_the_routes(ray_toolkit: Toolkit) -> None:
    name = ray_toolkit.name()
    ray_toolkit.run(basic.make_versioned_app("v1"), name=name, route_prefix="/proxied")
    wait_for(lambda: _stored_with(name, "/proxied"), 10, "the controller to store the tables with the app")
    proxy = _proxy()
    pid = ray.get(proxy.stats.remote(), timeout=30)["pid"]
    statuses: list[int] = []
    os.kill(pid, signal.SIGKILL)  # the proxy process this session started
    killed_at = time.monotonic()
    url = ray_toolkit.url + "/proxied/version"
    wait_for(lambda: _serves_v1(url, statuses), 60, "the proxy to come back", 0.02)
    assert ray.get(proxy.stats.remote(), timeout=30)["pid"] != pid
    # It starts from the stored tables whichever call comes first (Ray's resume, or the
    # controller's ready): never a 503 for want of routes (it raced, and lost, in a soak).
    assert statuses == [200], statuses
    print(f"proxy serving again {time.monotonic() - killed_at:.2f} s after SIGKILL")


def test_a_proxy_restarted_while_the_controller_is_down_serves_from_the_stored_tables(
    ray_toolkit: Toolkit,
) -> None:
    name = ray_toolkit.name()
    ray_toolkit.run(basic.make_versioned_app("v1"), name=name, route_prefix="/stored")

    wait_for(lambda: _stored_with(name, "/stored"), 10, "the controller to store the tables with the app")
    # Any: ray types actor methods as Never.
    controller: Any = ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)
    controller_pid = ray.get(controller.stats.remote(), timeout=30)["pid"]
    proxy = _proxy()
    proxy_pid = ray.get(proxy.stats.remote(), timeout=30)["pid"]
    statuses: list[int] = []
    url = ray_toolkit.url + "/stored/version"
    os.kill(controller_pid, signal.SIGSTOP)  # the controller this session started: down, not restarted
    try:
        os.kill(proxy_pid, signal.SIGKILL)  # the proxy this session started; Ray restarts it
        killed_at = time.monotonic()
        wait_for(lambda: _serves_v1(url, statuses), 60, "the restarted proxy to serve", 0.1)
        served_after = time.monotonic() - killed_at
        assert plain_http.get(ray_toolkit.url + "/-/healthz", timeout=5).status_code == 200
        assert plain_http.get(ray_toolkit.url + "/nowhere", timeout=5).status_code == 404  # a real 404 now
        assert set(statuses) <= {200, 503}, statuses  # a route it knows is never 404
        assert _process_state(controller_pid) == "T"  # all of it while the controller was stopped
    finally:
        os.kill(controller_pid, signal.SIGCONT)
    # The controller is back: the proxy follows it again (a new application is routed).
    other = ray_toolkit.name()
    ray_toolkit.run(basic.make_versioned_app("v1"), name=other, route_prefix="/stored-later")
    later = ray_toolkit.url + "/stored-later/version"
    wait_for(lambda: _serves_v1(later), 30, "the proxy to follow the controller")
    print(f"restarted proxy served from the stored tables {served_after:.2f} s after SIGKILL")


def _proxy() -> Any:
    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == NAMESPACE and a["name"].startswith("app_toolkit_proxy:")
    ]
    return ray.get_actor(names[0], namespace=NAMESPACE)


def _stored_with(name: str, route_prefix: str) -> bool:
    """Whether the tables the controller stored route ``route_prefix`` to the app's one replica."""
    tables = stored.load_tables()
    if tables is None:
        return False
    apps = tables[1].get(APPLICATIONS_KEY)
    replicas = tables[1].get(replicas_key(DeploymentID(name, "Ingress")))
    return (
        isinstance(apps, ApplicationTable)
        and any(a.route_prefix == route_prefix for a in apps.applications)
        and isinstance(replicas, ReplicaTable)
        and len(replicas.replicas) == 1
    )


def _serves_v1(url: str, statuses: list[int] | None = None) -> bool:
    try:
        response = plain_http.get(url, timeout=5)
    except httpx.HTTPError:
        return False  # the proxy is not listening yet
    if statuses is not None:
        statuses.append(response.status_code)
    return response.status_code == 200 and response.json()["version"] == "v1"


def _process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _fetch_in_thread(url: str, results: list[httpx.Response | Exception]) -> threading.Thread:
    def fetch() -> None:
        try:
            results.append(plain_http.get(url, timeout=60))
        except httpx.HTTPError as exc:
            results.append(exc)

    thread = threading.Thread(target=fetch)
    thread.start()
    return thread


@PATHS
@pytest.mark.parametrize("hang", ["blocked_loop", "sigstop"])
def test_a_hung_replica_is_killed_and_replaced_and_its_requests_end(
    ray_toolkit: Toolkit, hang: str, direct: bool
) -> None:
    name = ray_toolkit.name()
    ray_toolkit.run(hung.make_app(direct_ingress=direct), name=name, route_prefix="/hung")
    with ray_toolkit.client() as client:
        pid = client.get("/hung/pid").json()
    results: list[httpx.Response | Exception] = []
    started = time.monotonic()
    try:
        if hang == "blocked_loop":
            threads = [_fetch_in_thread(ray_toolkit.url + "/hung/block", results)]
            time.sleep(0.5)
        else:
            os.kill(pid, signal.SIGSTOP)  # the replica process this test deployed
            threads = []
        threads += [_fetch_in_thread(ray_toolkit.url + "/hung/pid", results) for _ in range(3)]
        # Checks every 0.5 s, 1 s timeout, 2 failures: killed within a few seconds.
        wait_for(lambda: _gone(pid), 30, "the hung replica's process to be killed")
        for thread in threads:
            thread.join(timeout=30)
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)
    assert len(results) == len(threads), "a request to the hung replica never ended"
    # Each answered, on both paths: lost while it ran there (502), read there but never
    # run (503 with Retry-After), or served by the replacement (on the direct path, the
    # connections the hung process never read are handed on).
    answers = ((502, None), (503, "1"), (200, None))
    for result in results:
        assert isinstance(result, httpx.Response), result
        assert (result.status_code, result.headers.get("retry-after")) in answers, result
    if hang == "blocked_loop":
        # The request that hung it ran there: 502 (proxied, after one more try, which hung
        # the replacement too: a GET is sent once more when its replica is lost).
        assert any(isinstance(r, httpx.Response) and r.status_code == 502 for r in results)
    assert time.monotonic() - started < 30

    def replacement() -> int | None:
        with ray_toolkit.client() as client:
            response = client.get("/hung/pid")
        return response.json() if response.status_code == 200 and response.json() != pid else None

    wait_for(replacement, 30, "a replacement replica serving")
    replicas = tk.status().applications[name].deployments["Ingress"].replicas
    assert len(replicas) == 1 and replicas[0].state is tk.ReplicaState.RUNNING


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_slow_reader_does_not_make_the_proxy_buffer_the_stream(ray_toolkit: Toolkit) -> None:
    ray_toolkit.run(streams.make_app(), route_prefix="/fire")
    proxies = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("app_toolkit_proxy:")
    ]
    # Any: ray types actor methods as Never.
    actors: list[Any] = [ray.get_actor(name, namespace=NAMESPACE) for name in proxies]
    pids = [ray.get(actor.stats.remote(), timeout=30)["pid"] for actor in actors]
    before = sum(_rss_mb(pid) for pid in pids)
    with socket.create_connection(("127.0.0.1", int(ray_toolkit.url.rsplit(":", 1)[1])), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(b"GET /fire/firehose?mib=1024 HTTP/1.1\r\nhost: x\r\n\r\n")
        received = 0
        started = time.monotonic()
        while time.monotonic() - started < 6:  # a client on a slow link: ~100 KB/s
            received += len(sock.recv(10_000))
            time.sleep(0.1)
        growth = sum(_rss_mb(pid) for pid in pids) - before
    print(f"proxy RSS grew {growth:.1f} MB while a client read {received} bytes of a 1 GiB stream")
    assert received > 0
    assert growth < 20, f"the proxy grew by {growth:.0f} MB while the client read {received} bytes"
