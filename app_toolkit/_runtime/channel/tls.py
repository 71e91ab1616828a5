"""TLS for the data plane, when the cluster asks for it.

Off unless ``APP_TOOLKIT_CHANNEL_TLS=1``, or unless Ray itself runs with TLS
(``RAY_USE_TLS=1``) and ``APP_TOOLKIT_CHANNEL_TLS`` is not ``0``. The files are Ray's:
``RAY_TLS_SERVER_CERT``, ``RAY_TLS_SERVER_KEY`` and ``RAY_TLS_CA_CERT``, each overridable
with ``APP_TOOLKIT_TLS_CERT``, ``APP_TOOLKIT_TLS_KEY`` and ``APP_TOOLKIT_TLS_CA``. Every
process of the cluster needs them (set them where Ray is started on each node).

Both ends present the certificate and require the peer's to be signed by the CA (mutual
TLS): the CA vouches that the peer belongs to the cluster. Host names are not checked —
nodes are reached by address, and the handshake in ``handshake.py`` already proves that
the peer is the very replica the caller asked for.
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from app_toolkit.exceptions import ConfigError

TLS_ENV = "APP_TOOLKIT_CHANNEL_TLS"
_FILES = {  # what each file is: (the toolkit's variable, Ray's variable)
    "certificate": ("APP_TOOLKIT_TLS_CERT", "RAY_TLS_SERVER_CERT"),
    "private key": ("APP_TOOLKIT_TLS_KEY", "RAY_TLS_SERVER_KEY"),
    "CA certificate": ("APP_TOOLKIT_TLS_CA", "RAY_TLS_CA_CERT"),
}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class TLSFiles:
    cert: str
    key: str
    ca: str


def tls_files(environ: Mapping[str, str] = os.environ) -> TLSFiles | None:
    """The files to use, or None when the data plane runs without TLS. Raises
    ConfigError when TLS is asked for and a file is not named or cannot be read."""
    wanted = environ.get(TLS_ENV, "").strip().lower()
    if wanted not in ("", *_TRUE, *_FALSE):
        raise ConfigError(f"{TLS_ENV}={environ[TLS_ENV]!r}: use 1 (TLS on the data plane) or 0 (off)")
    ray_tls = environ.get("RAY_USE_TLS", "").strip().lower() in _TRUE
    if wanted in _FALSE or (wanted == "" and not ray_tls):
        return None
    paths: list[str] = []
    for what, (ours, rays) in _FILES.items():
        path = environ.get(ours) or environ.get(rays)
        if not path:
            raise ConfigError(
                f"TLS on the data plane needs a {what}: set {ours} (or Ray's {rays}) on every node, "
                f"or set {TLS_ENV}=0 to run the data plane without TLS"
            )
        if not os.access(path, os.R_OK):
            raise ConfigError(f"The TLS {what} {path!r} (from {ours} or {rays}) cannot be read")
        paths.append(path)
    return TLSFiles(*paths)


@functools.cache
def _configured() -> TLSFiles | None:
    return tls_files()


def replica_tls() -> ssl.SSLContext | None:
    """What this process's replica listens with (raises ConfigError if misconfigured)."""
    files = _configured()
    return None if files is None else server_context(files)


def caller_tls(replica_uses_tls: bool) -> ssl.SSLContext | None:
    """What this process connects to a replica with. Both ends must agree: a caller set
    up for TLS never falls back to clear text, and one without the files cannot talk to
    a replica that requires TLS (ConfigError, saying which)."""
    files = _configured()
    if replica_uses_tls and files is None:
        raise ConfigError(
            f"The replica takes TLS connections only, but this process has no TLS files: set "
            f"{TLS_ENV}=1 and the certificate variables here as on the replica's node"
        )
    if files is not None and not replica_uses_tls:
        raise ConfigError(
            f"This process uses TLS on the data plane ({TLS_ENV} or RAY_USE_TLS), but the "
            "replica listens without it: set the same TLS variables on every node"
        )
    return None if files is None else client_context(files)


@functools.cache
def server_context(files: TLSFiles) -> ssl.SSLContext:
    """For a replica's listening socket: asks every caller for its certificate."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=files.ca)
    context.load_cert_chain(files.cert, files.key)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


@functools.cache
def client_context(files: TLSFiles) -> ssl.SSLContext:
    """For a caller's connections to replicas."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=files.ca)
    context.load_cert_chain(files.cert, files.key)
    context.check_hostname = False  # see the module's docstring
    context.verify_mode = ssl.CERT_REQUIRED
    return context
