"""The data plane over TLS on a real embedded Ray cluster (its own, in a fresh process)."""

from __future__ import annotations

from pathlib import Path

import trustme

from tests.conftest import free_port
from tests.scenario import run_scenario


def test_replicas_and_callers_talk_tls_when_the_cluster_is_set_up_for_it(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    env = {
        "APP_TOOLKIT_CHANNEL_TLS": "1",
        "APP_TOOLKIT_TLS_CERT": str(tmp_path / "cert.pem"),
        "APP_TOOLKIT_TLS_KEY": str(tmp_path / "key.pem"),
        "APP_TOOLKIT_TLS_CA": str(tmp_path / "ca.pem"),
    }
    seen = run_scenario("tests.integration.tls_scenario", str(free_port()), timeout_s=240, env_extra=env)
    assert seen["http"] == [200, "HI"]
    assert seen["replicas_tls"] == [True]
    assert len(seen["handshakes"]) == 2 and all(v.startswith("TLSv1.") for v in seen["handshakes"])
