"""HTTPS for clients: Ray Serve's ``http_options`` fields (``ssl_keyfile``,
``ssl_certfile``, ``ssl_keyfile_password``, ``ssl_ca_certs``) and uvicorn's
``--ssl-cert-reqs``, read into the standard library's TLS server context (TLS 1.2 or
newer, its default ciphers), the one rule for every proxy of the cluster.

The files are read where the options are parsed, so a missing or bad key or certificate
fails the start naming the file, and again by each proxy, which looks at them once a
second: certificates replaced on disk are served to new connections without a restart.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field

from app_toolkit.exceptions import ConfigError

#: ``ssl_cert_reqs`` as uvicorn takes it: 0 none, 1 optional, 2 required (ssl.CERT_*).
CERT_REQS = (ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED)


@dataclass(frozen=True, slots=True)
class ClientTLS:
    """What a proxy's TLS context is made of: absolute paths, a password, client certs."""

    certfile: str
    keyfile: str | None
    password: str | None = field(repr=False)
    ca_certs: str | None = None
    cert_reqs: int = 0

    def context(self) -> ssl.SSLContext:
        """A server context of these files; ConfigError naming the file at fault. It never
        asks for a password on the terminal (OpenSSL would, for an encrypted key without one)."""
        given = (
            ("ssl_certfile", self.certfile),
            ("ssl_keyfile", self.keyfile),
            ("ssl_ca_certs", self.ca_certs),
        )
        for option, path in given:
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"HTTPS: {option} {path!r} is not a file that exists here")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        password = self.password
        try:
            context.load_cert_chain(
                self.certfile, self.keyfile, password if password is not None else _no_password
            )
        except (ssl.SSLError, OSError) as exc:
            files = self.certfile if self.keyfile is None else f"{self.certfile} and {self.keyfile}"
            raise ConfigError(
                f"HTTPS: cannot load the certificate and key of {files} ({exc}); give ssl_certfile "
                "(PEM, the chain) and ssl_keyfile (PEM; ssl_keyfile_password if it is encrypted)"
            ) from None
        if self.ca_certs is not None:
            try:
                context.load_verify_locations(self.ca_certs)
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(
                    f"HTTPS: cannot load the CA certificates of {self.ca_certs} ({exc})"
                ) from None
        context.verify_mode = ssl.VerifyMode(self.cert_reqs)
        if self.cert_reqs:
            # A resumed session skips the certificate checks: no TLS 1.3 tickets, so a
            # TLS 1.3 client proves itself on every connection (a TLS 1.2 client may still
            # resume from the server's session cache, for up to its 5 minutes).
            context.num_tickets = 0
        return context

    def files_state(self) -> tuple[tuple[int, ...], ...]:
        """What identifies the files' content on disk (a replacement changes it)."""
        states: list[tuple[int, ...]] = []
        for path in (self.certfile, self.keyfile, self.ca_certs):
            if path is None:
                continue
            try:
                info = os.stat(path)
            except OSError:
                states.append((-1,))
                continue
            states.append((info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns))
        return tuple(states)


def _no_password() -> bytes:
    return b""  # (an encrypted key without ssl_keyfile_password then fails to load)


def absolute(path: str | None) -> str | None:
    return os.path.abspath(path) if path is not None else None
