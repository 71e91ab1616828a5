"""The data plane over TLS on a real embedded Ray cluster (its own, in a fresh process)."""

from __future__ import annotations

from pathlib import Path

import trustme

from tests.conftest import free_port
from tests.scenario import run_scenario
from tests.tls_certs import cluster_certs, tls_env


def test_replicas_and_callers_talk_tls_when_the_cluster_is_set_up_for_it(tmp_path: Path) -> None:
    env = tls_env(cluster_certs(trustme.CA(), tmp_path / "cluster"))
    seen = run_scenario("tests.integration.tls_scenario", str(free_port()), timeout_s=240, env_extra=env)
    assert seen["http"] == [200, "HI"]
    assert seen["replicas_tls"] == [True]
    assert len(seen["handshakes"]) == 2 and all(v.startswith("TLSv1.") for v in seen["handshakes"])
