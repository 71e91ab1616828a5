"""What the toolkit exposes on the network (docs/security.md): on the embedded
single-machine cluster every socket it listens on is on loopback."""

from __future__ import annotations

import ipaddress
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


def listening_addresses(port: int) -> set[str]:
    """The local addresses of every TCP socket on this machine listening on ``port``."""
    found: set[str] = set()
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
            found.add(socket.inet_ntop(family, raw))
    return found


def test_listening_addresses_read_from_proc() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert listening_addresses(sock.getsockname()[1]) == {"127.0.0.1"}


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
        addresses = listening_addresses(info.port)
        assert addresses and all(ipaddress.ip_address(a).is_loopback for a in addresses), (info, addresses)
    proxy_port = int(ray_toolkit.url.rsplit(":", 1)[1])
    assert listening_addresses(proxy_port) == {"127.0.0.1"}


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", "*"])
def test_replicas_never_listen_on_every_interface(monkeypatch: pytest.MonkeyPatch, wildcard: str) -> None:
    monkeypatch.setenv(DATA_PLANE_HOST_ENV, wildcard)
    with pytest.raises(ConfigError, match="every interface"):
        data_plane_host()
    monkeypatch.setenv(DATA_PLANE_HOST_ENV, "10.1.2.3")
    assert data_plane_host() == "10.1.2.3"
