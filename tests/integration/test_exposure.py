"""What the toolkit exposes on the network (docs/security.md): on the embedded
single-machine cluster every socket it listens on is on loopback."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest
import ray

from app_toolkit._runtime.backends.ray.cluster import DATA_PLANE_HOST_ENV, controller_actor, data_plane_host
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.tables import ReplicaTable, replicas_key
from app_toolkit.exceptions import ConfigError
from tests.apps import basic
from tests.conftest import Toolkit

_LISTEN = "0A"


def listening_sockets(port: int) -> dict[int, str]:
    """Every TCP socket on this machine listening on ``port``: its inode and local address."""
    found: dict[int, str] = {}
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].split(":")
            if fields[3] != _LISTEN or int(port_hex, 16) != port:
                continue
            raw = bytes.fromhex(address)
            # /proc prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found[int(fields[9])] = socket.inet_ntop(family, raw)
    return found


def sockets_of(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes: set[int] = set()
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # it ended meanwhile
        return inodes
    for descriptor in descriptors:
        try:
            target = os.readlink(descriptor)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def owners_addresses(port: int) -> set[str]:
    """The addresses on which the process listening on ``port`` on loopback listens on that
    port (the empty set: nothing listens there on loopback). Sockets of other processes on
    the same port number, on another address (another test's, say), are not its."""
    listening = listening_sockets(port)
    on_loopback = [inode for inode, address in listening.items() if ipaddress.ip_address(address).is_loopback]
    if not on_loopback:
        return set(listening.values())
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and on_loopback[0] in (sockets := sockets_of(int(entry.name))):
            return {address for inode, address in listening.items() if inode in sockets}
    return set()


def test_listening_sockets_read_from_proc() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert set(listening_sockets(port).values()) == {"127.0.0.1"}
        assert set(listening_sockets(port)) <= sockets_of(os.getpid())
        assert owners_addresses(port) == {"127.0.0.1"}


def test_replicas_and_proxy_listen_on_loopback_only_on_the_embedded_cluster(ray_toolkit: Toolkit) -> None:
    name = ray_toolkit.name()
    ray_toolkit.run(basic.make_composed(), name=name, route_prefix="/composed")
    with ray_toolkit.client() as client:
        assert client.get("/composed/add/1").status_code == 200
    keys = {replicas_key(DeploymentID(name, deployment)): -1 for deployment in ("Front", "Counter", "shout")}
    updates = ray.get(controller_actor().run.remote(lambda c: c.listen(keys, 0.0)))
    replicas = [
        info
        for update in updates.values()
        if isinstance(update.table, ReplicaTable)
        for info in update.table.replicas
    ]
    assert len(replicas) >= 3
    for info in replicas:
        assert ipaddress.ip_address(info.host).is_loopback, info
        addresses = owners_addresses(info.port)
        assert addresses and all(ipaddress.ip_address(a).is_loopback for a in addresses), (info, addresses)
    proxy_port = int(ray_toolkit.url.rsplit(":", 1)[1])
    assert owners_addresses(proxy_port) == {"127.0.0.1"}


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", "*"])
def test_replicas_never_listen_on_every_interface(monkeypatch: pytest.MonkeyPatch, wildcard: str) -> None:
    monkeypatch.setenv(DATA_PLANE_HOST_ENV, wildcard)
    with pytest.raises(ConfigError, match="every interface"):
        data_plane_host()
    monkeypatch.setenv(DATA_PLANE_HOST_ENV, "10.1.2.3")
    assert data_plane_host() == "10.1.2.3"
