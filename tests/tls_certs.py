"""Certificates from a throwaway CA for the data plane's TLS tests."""

from __future__ import annotations

from pathlib import Path

import trustme

from app_toolkit._runtime.channel.tls import TLS_ENV, TLSFiles


def cluster_certs(ca: trustme.CA, where: Path) -> TLSFiles:
    """A node certificate signed by ``ca``, its key and the CA, written under ``where``."""
    where.mkdir(exist_ok=True)
    cert = ca.issue_cert("127.0.0.1", "node.cluster.internal")
    cert.cert_chain_pems[0].write_to_path(str(where / "cert.pem"))
    cert.private_key_pem.write_to_path(str(where / "key.pem"))
    ca.cert_pem.write_to_path(str(where / "ca.pem"))
    return TLSFiles(str(where / "cert.pem"), str(where / "key.pem"), str(where / "ca.pem"))


def tls_env(files: TLSFiles) -> dict[str, str]:
    """The environment that turns TLS on with ``files``."""
    return {
        TLS_ENV: "1",
        "APP_TOOLKIT_TLS_CERT": files.cert,
        "APP_TOOLKIT_TLS_KEY": files.key,
        "APP_TOOLKIT_TLS_CA": files.ca,
    }
