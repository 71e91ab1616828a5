"""Client certificates that name API keys (docs/security.md): HTTPS with ``ssl_ca_certs``
and ``ssl_cert_reqs`` on the local backend, read by httpx and websockets presenting
certificates of a throwaway CA; a request that sends no key over a connection whose
certificate a key's ``client_cert`` names is that key's."""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme
from fastapi import Depends, FastAPI, WebSocket
from websockets.sync.client import connect

import app_toolkit as tk
from app_toolkit.config import parse_http_options
from app_toolkit.config.api_keys import key_hash, new_key
from app_toolkit.exceptions import ConfigError
from tests.conftest import free_port
from tests.deployments import as_deployment

api = FastAPI()


@api.get("/who")
async def who(name: str | None = Depends(tk.api_key_name)) -> dict[str, str | None]:
    return {"key": name}


@api.websocket("/who")
async def who_socket(socket: WebSocket) -> None:
    await socket.accept()
    await socket.send_text(str(tk.api_key_name(socket)))
    await socket.close()


@tk.deployment
@tk.ingress(api)
class Certified:
    pass


CA = trustme.CA()
ALICE_CERT, STRANGER_CERT = CA.issue_cert("alice@example.com"), CA.issue_cert("stranger@example.com")
BOB = new_key()


def fingerprint(leaf: trustme.LeafCert) -> str:
    """As ``openssl x509 -noout -fingerprint -sha256`` prints it: upper-case, with colons."""
    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())).hexdigest()
    return "sha256:" + ":".join(digest[i : i + 2] for i in range(0, 64, 2)).upper()


def tls_options(folder: Path) -> dict[str, object]:
    """HTTPS of a certificate of ``CA`` that asks clients for one of ``CA`` (optional: a
    client without one may send a key instead)."""
    CA.cert_pem.write_to_path(str(folder / "ca.pem"))
    served = CA.issue_cert("127.0.0.1")
    served.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    served.private_key_pem.write_to_path(str(folder / "key.pem"))
    return {
        "ssl_certfile": str(folder / "cert.pem"),
        "ssl_keyfile": str(folder / "key.pem"),
        "ssl_ca_certs": str(folder / "ca.pem"),
        "ssl_cert_reqs": 1,
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The local backend serving :func:`tls_options`, with alice's key named by her
    certificate (the shared backend is stopped first)."""
    from app_toolkit._runtime.backends.base import current_session

    if current_session(create=False) is not None:
        tk.shutdown()
    tls = tls_options(tmp_path_factory.mktemp("tls"))
    port = free_port()
    tk.start(
        backend="local",
        http_options={
            "host": "127.0.0.1",
            "port": port,
            **tls,
            "api_keys": [
                {"name": "alice", "hash": key_hash(new_key()), "client_cert": fingerprint(ALICE_CERT)},
                {"name": "bob", "hash": key_hash(BOB)},
            ],
        },
    )
    try:
        tk.run(as_deployment(Certified).bind(), name="certified", route_prefix="/", backend="local")
        yield f"127.0.0.1:{port}"
    finally:
        tk.shutdown()


def _context(leaf: trustme.LeafCert | None, ca: trustme.CA = CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)  # the served certificate is of the same CA
    if leaf is not None:
        leaf.configure_cert(context)
    return context


def _who(
    address: str, leaf: trustme.LeafCert | None, headers: dict[str, str] | None = None
) -> httpx.Response:
    with httpx.Client(verify=_context(leaf), timeout=10) as client:
        return client.get(f"https://{address}/who", headers=headers)


def test_a_client_certificate_names_the_key_of_a_request_that_sends_none(served: str) -> None:
    assert _who(served, ALICE_CERT).json() == {"key": "alice"}
    # A key sent is the request's, and must be valid.
    assert _who(served, ALICE_CERT, {"x-api-key": BOB}).json() == {"key": "bob"}
    assert _who(served, ALICE_CERT, {"x-api-key": BOB + "x"}).status_code == 401
    # A certificate of the CA that names no key, and none: a key is needed.
    assert _who(served, STRANGER_CERT).status_code == 401
    assert _who(served, None).status_code == 401
    assert _who(served, None, {"authorization": f"Bearer {BOB}"}).json() == {"key": "bob"}
    assert _who(served, ALICE_CERT, {"x-api-key": ""}).status_code == 401  # a key sent, empty
    with httpx.Client(verify=_context(ALICE_CERT), timeout=10) as client:  # one connection
        assert [client.get(f"https://{served}/who").json()["key"] for _ in range(3)] == ["alice"] * 3
    # A certificate of another CA fails the handshake (under TLS 1.3 the client hears of
    # it as it reads the answer: the connection ends without one).
    with pytest.raises(httpx.TransportError):  # (refused, reset or ended: as the timing falls)
        _who(served, trustme.CA().issue_cert("alice@example.com"))
    with connect(f"wss://{served}/who", ssl=_context(ALICE_CERT), open_timeout=10) as socket:
        assert socket.recv(timeout=10) == "alice"


def test_a_client_certificate_names_one_key_written_as_its_sha256(tmp_path: Path) -> None:
    tls = tls_options(tmp_path)
    entry = {"name": "alice", "hash": key_hash(new_key()), "client_cert": fingerprint(ALICE_CERT)}
    parsed = parse_http_options({**tls, "api_keys": [entry]})
    written = fingerprint(ALICE_CERT).removeprefix("sha256:").replace(":", "").lower()
    assert parsed.api_keys[0].client_cert == "sha256:" + written  # one form, whatever was given
    with pytest.raises(ConfigError, match="same client_cert"):
        parse_http_options(
            {**tls, "api_keys": [entry, {**entry, "name": "eve", "hash": key_hash(new_key())}]}
        )
    with pytest.raises(ConfigError, match="named by a client certificate"):
        parse_http_options({"api_keys": [entry]})  # no HTTPS that asks for one
    with pytest.raises(ConfigError, match="client_cert must be sha256"):
        parse_http_options({**tls, "api_keys": [{**entry, "client_cert": "sha256:abc"}]})
