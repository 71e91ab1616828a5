"""TLS on the data plane: which files, when it is on, and what it does on the wire (real
loopback sockets, certificates from a throwaway CA)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import trustme

from app_toolkit._runtime.channel import tls
from app_toolkit._runtime.channel.client import ChannelClient
from app_toolkit._runtime.channel.server import start_server
from app_toolkit._runtime.channel.tls import TLSFiles, caller_tls, client_context, server_context, tls_files
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit.exceptions import ConfigError, ReplicaUnavailableError
from tests.integration.test_channel import TOKEN, Handler, Tap, request
from tests.tls_certs import cluster_certs

SECRET = b"a body nobody on the wire may read"


@pytest.fixture
def files(tmp_path: Path) -> TLSFiles:
    return cluster_certs(trustme.CA(), tmp_path / "cluster")


def test_off_unless_asked_and_rays_files_are_used(files: TLSFiles) -> None:
    assert tls_files({}) is None
    rays = {"RAY_TLS_SERVER_CERT": files.cert, "RAY_TLS_SERVER_KEY": files.key, "RAY_TLS_CA_CERT": files.ca}
    assert tls_files(rays) is None  # Ray's files alone do not turn it on
    assert tls_files({**rays, "RAY_USE_TLS": "1"}) == files  # Ray runs with TLS: so do we
    assert tls_files({**rays, "RAY_USE_TLS": "1", tls.TLS_ENV: "0"}) is None  # unless told not to
    ours = {
        "APP_TOOLKIT_TLS_CERT": files.cert,
        "APP_TOOLKIT_TLS_KEY": files.key,
        "APP_TOOLKIT_TLS_CA": files.ca,
    }
    mixed = {**ours, "RAY_TLS_SERVER_CERT": "/nowhere", tls.TLS_ENV: "1"}
    assert tls_files(mixed) == files  # the toolkit's variables win over Ray's


def test_asking_for_tls_without_usable_files_says_what_to_set(files: TLSFiles) -> None:
    with pytest.raises(ConfigError, match="needs a private key: set APP_TOOLKIT_TLS_KEY"):
        tls_files({tls.TLS_ENV: "1", "APP_TOOLKIT_TLS_CERT": files.cert, "APP_TOOLKIT_TLS_CA": files.ca})
    with pytest.raises(ConfigError, match="cannot be read"):
        tls_files(
            {
                tls.TLS_ENV: "1",
                "APP_TOOLKIT_TLS_CERT": files.cert,
                "APP_TOOLKIT_TLS_KEY": files.key,
                "APP_TOOLKIT_TLS_CA": "/no/such/ca.pem",
            }
        )
    with pytest.raises(ConfigError, match="use 1"):
        tls_files({tls.TLS_ENV: "maybe"})


def test_both_ends_must_agree(monkeypatch: pytest.MonkeyPatch, files: TLSFiles) -> None:
    tls._configured.cache_clear()
    monkeypatch.setattr(tls, "_configured", lambda: None)
    assert caller_tls(False) is None
    with pytest.raises(ConfigError, match="takes TLS connections only"):
        caller_tls(True)
    monkeypatch.setattr(tls, "_configured", lambda: files)
    assert caller_tls(True) is client_context(files)
    with pytest.raises(ConfigError, match="listens without it"):
        caller_tls(False)  # never a silent fall back to clear text


@pytest.mark.anyio
async def test_requests_cross_the_wire_encrypted(files: TLSFiles) -> None:
    server, port = await start_server(Handler(), "127.0.0.1", TOKEN, tls=server_context(files))
    tap = Tap(port)
    await tap.start()
    client = ChannelClient("127.0.0.1", tap.port, TOKEN, tls=client_context(files))
    try:
        exchange = await client.open(request(SECRET))
        response = await asyncio.wait_for(exchange.recv(), 5)
        assert isinstance(response, HTTPResponse) and response.body == SECRET
        assert tap.upstream[:1] == b"\x16" and tap.downstream[:1] == b"\x16"  # TLS handshake records
        for wire in (tap.upstream, tap.downstream):
            assert SECRET not in wire and TOKEN not in wire
    finally:
        client.close()
        await tap.close()
        server.close()


@pytest.mark.anyio
async def test_callers_without_a_certificate_of_the_cluster_get_nothing(
    files: TLSFiles, tmp_path: Path
) -> None:
    server, port = await start_server(Handler(), "127.0.0.1", TOKEN, tls=server_context(files))
    strangers = cluster_certs(trustme.CA(), tmp_path / "strangers")
    try:
        for caller_context in (None, client_context(strangers)):
            client = ChannelClient("127.0.0.1", port, TOKEN, tls=caller_context)
            with pytest.raises(ReplicaUnavailableError):
                await asyncio.wait_for(client.open(request(b"x")), 15)
            client.close()
    finally:
        server.close()
