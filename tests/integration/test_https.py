"""HTTPS for clients (docs/security.md): a real front on 127.0.0.1 on the local backend
serving TLS with a throwaway CA's certificate, read by httpx, an SSE client, websockets
and a raw socket; the certificate replaced on disk; bad files refused at start."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import HTMLResponse
from websockets.sync.client import connect

import app_toolkit as tk
from app_toolkit.config import parse_http_options
from app_toolkit.exceptions import ConfigError
from tests.browser import chromium
from tests.conftest import free_port
from tests.deployments import as_deployment

api = FastAPI()


@api.get("/hello")
async def hello(request: Request) -> dict[str, str]:
    return {"scheme": request.url.scheme}


@api.get("/ticks")
async def ticks() -> tk.EventStream:
    async def three() -> AsyncIterator[dict[str, str]]:
        for n in range(3):
            yield {"data": str(n)}
            await asyncio.sleep(0.01)

    return tk.EventStream(three())


@api.websocket("/echo")
async def echo(socket: WebSocket) -> None:
    await socket.accept()
    await socket.send_text(f"{socket.url.scheme}:{await socket.receive_text()}")
    await socket.close()


PAGE = """<!doctype html><meta charset="utf-8"><title>https</title><p id="out"></p><script>
(async () => {
  const seen = [];
  seen.push((await (await fetch("/hello")).json()).scheme);
  seen.push(await new Promise((done) => {
    const ticks = [], events = new EventSource("/ticks");
    events.onmessage = (event) => {
      ticks.push(event.data);
      if (ticks.length === 3) { events.close(); done(ticks.join("")); }
    };
  }));
  seen.push(await new Promise((done) => {
    const socket = new WebSocket("wss://" + location.host + "/echo");
    socket.onopen = () => socket.send("hi");
    socket.onmessage = (event) => done(event.data);
  }));
  document.getElementById("out").textContent = seen.join(" ");
})();
</script>"""


@api.get("/page")
async def page() -> HTMLResponse:
    return HTMLResponse(PAGE)


@tk.deployment
@tk.ingress(api)
class Secure:
    pass


def _write(cert: trustme.LeafCert, folder: Path) -> tuple[Path, Path]:
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    return folder / "cert.pem", folder / "key.pem"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, trustme.CA, Path]]:
    """The local backend serving HTTPS (the shared backend is stopped first)."""
    from app_toolkit._runtime.backends.base import current_session

    if current_session(create=False) is not None:
        tk.shutdown()
    ca = trustme.CA()
    folder = tmp_path_factory.mktemp("tls")
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    cert, key = _write(ca.issue_cert("127.0.0.1"), folder)
    port = free_port()
    tk.start(
        backend="local",
        http_options={"host": "127.0.0.1", "port": port, "ssl_certfile": str(cert), "ssl_keyfile": str(key)},
    )
    try:
        tk.run(as_deployment(Secure).bind(), name="secure", route_prefix="/", backend="local")
        yield port, ca, folder
    finally:
        tk.shutdown()


def _served_cert(port: int, ca: Path) -> bytes:
    """The certificate a new connection is served (DER)."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            served = tls.getpeercert(binary_form=True)
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    assert served is not None
    return served


def test_https_sse_and_wss_are_served_with_the_certificate(served: tuple[int, trustme.CA, Path]) -> None:
    port, _, folder = served
    context = ssl.create_default_context(cafile=str(folder / "ca.pem"))
    with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=context, timeout=10) as client:
        assert client.get("/hello").json() == {"scheme": "https"}  # the app sees https
        with client.stream("GET", "/ticks") as events:
            lines = [line for line in events.iter_lines() if line.startswith("data:")]
        assert lines == ["data: 0", "data: 1", "data: 2"]
    with connect(f"wss://127.0.0.1:{port}/echo", ssl=context, open_timeout=10) as ws:
        ws.send("hi")
        assert ws.recv(timeout=10) == "wss:hi"
    # Plain HTTP to the TLS port gets what uvicorn gives it: no HTTP answer, the connection
    # ends in the failed handshake.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        raw.settimeout(10)
        try:
            answer = raw.recv(4096)
        except ConnectionResetError:
            answer = b""
        assert not answer.startswith(b"HTTP/")


def _spki_hash(cert_pem: Path) -> str:
    """The base64 SHA-256 of a certificate's public key (Chromium's pin format)."""
    public = x509.load_pem_x509_certificate(cert_pem.read_bytes()).public_key()
    spki = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashes.Hash(hashes.SHA256())
    digest.update(spki)
    return base64.b64encode(digest.finalize()).decode()


def test_chromium_loads_a_page_streams_sse_and_opens_wss_over_https(
    served: tuple[int, trustme.CA, Path],
) -> None:
    """Headless Chromium trusts the test certificate by its public key's hash, loads a page
    over https://, and the page fetches, streams SSE and talks over wss:// to the app."""
    port, _, folder = served
    with chromium(trusted_spki=_spki_hash(folder / "cert.pem")) as browser:
        page = browser.new_page()
        page.goto(f"https://127.0.0.1:{port}/page", timeout=30_000)
        page.wait_for_function("document.getElementById('out').textContent !== ''", timeout=30_000)
        assert page.inner_text("#out") == "https 012 wss:hi"
        page.close()


def test_a_certificate_replaced_on_disk_reaches_new_connections(served: tuple[int, trustme.CA, Path]) -> None:
    port, ca, folder = served
    before = _served_cert(port, folder / "ca.pem")
    fresh = folder / "fresh"
    fresh.mkdir()
    renewed = ca.issue_cert("127.0.0.1")
    cert, key = _write(renewed, fresh)
    os.replace(key, folder / "key.pem")  # the key first: a handshake between the two fails
    os.replace(cert, folder / "cert.pem")
    wanted = ssl.PEM_cert_to_DER_cert(renewed.cert_chain_pems[0].bytes().decode())
    deadline = time.monotonic() + 10
    now = before
    while now != wanted and time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            now = _served_cert(port, folder / "ca.pem")
        except ssl.SSLError:
            continue  # the new key with the old certificate, for a moment
    assert now == wanted != before


def test_an_encrypted_key_needs_its_password_and_never_prompts(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    leaf = trustme.CA().issue_cert("127.0.0.1")
    cert, key = _write(leaf, tmp_path)
    loaded = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    key.write_bytes(
        loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"sesame"),
        )
    )
    options = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    with pytest.raises(ConfigError, match="ssl_keyfile_password") as refused:
        parse_http_options(options)  # no terminal prompt: a clear error
    assert "ssl_keyfile_password" in str(refused.value)
    with pytest.raises(ConfigError) as wrong:
        parse_http_options({**options, "ssl_keyfile_password": "open-sesame"})
    assert "open-sesame" not in str(wrong.value)  # a password never repeated
    http = parse_http_options({**options, "ssl_keyfile_password": "sesame"})
    assert "sesame" not in repr(http)


def test_bad_tls_files_fail_the_start_naming_them(tmp_path: Path) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="junk.pem"):
        parse_http_options({"ssl_certfile": str(tmp_path / "junk.pem")})
    with pytest.raises(ConfigError, match="missing.pem"):
        parse_http_options({"ssl_certfile": str(tmp_path / "missing.pem")})
    with pytest.raises(ConfigError, match="needs ssl_certfile"):
        parse_http_options({"ssl_keyfile": str(tmp_path / "junk.pem")})
    with pytest.raises(ConfigError, match="give ssl_ca_certs"):
        parse_http_options({"ssl_certfile": str(tmp_path / "junk.pem"), "ssl_cert_reqs": 2})
