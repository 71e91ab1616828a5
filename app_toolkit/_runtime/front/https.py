"""A proxy's TLS for clients: the context its server serves HTTPS with, kept current with
the certificate files, and the certificate a client presented (:func:`client_cert_of`),
which may name its API key.

The files are looked at no more than once a second, as a TLS handshake begins; when they
changed (inode, size or time), a new context is made of them, and that handshake and the
following ones use it: certificates replaced on disk (write new files, then ``mv`` them
over the old) reach new connections without a restart, while open ones keep theirs. Files
that do not load keep the context made before them (logged, naming them).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import time

from app_toolkit.config.client_tls import ClientTLS
from app_toolkit.exceptions import ConfigError

logger = logging.getLogger("app_toolkit.proxy")

#: Seconds between two looks at the certificate files.
FILES_CHECK_S = 1.0


class ServedTLS:
    """The context a server is given (:attr:`context`), which hands each handshake the
    context of the files as they are now."""

    def __init__(self, tls: ClientTLS) -> None:
        self._tls = tls
        self._state = tls.files_state()
        self._current = self.context = tls.context()
        self._next_look = time.monotonic() + FILES_CHECK_S
        self.context.sni_callback = self._choose  # called with every client hello

    def _choose(self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        now = time.monotonic()
        if now >= self._next_look:
            self._next_look = now + FILES_CHECK_S
            self._look_at_files()
        if self._current is not context:
            connection.context = self._current

    def _look_at_files(self) -> None:
        state = self._tls.files_state()
        if state == self._state:
            return
        self._state = state  # logged once per change, whatever comes of it
        try:
            self._current = self._tls.context()
        except ConfigError as exc:
            logger.error("%s; the certificate loaded before stays in use", exc)
            return
        logger.info("HTTPS: the certificate files changed; new connections get them (%s)", self._tls.certfile)


def client_cert_of(transport: asyncio.BaseTransport) -> str | None:
    """``sha256:<hex>`` of the certificate the client presented on this connection, which
    its handshake verified against ``ssl_ca_certs``; None without TLS, or without one."""
    tls = transport.get_extra_info("ssl_object")
    if tls is None:
        return None
    der = tls.getpeercert(binary_form=True)
    return "sha256:" + hashlib.sha256(der).hexdigest() if der else None
