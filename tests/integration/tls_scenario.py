"""An embedded cluster whose data plane runs over TLS (the TLS variables are in this
process's environment, so the raylet and every worker inherit them).

Runs in a fresh process (``test_channel_tls_on_ray.py``). Prints one JSON line.
"""

from __future__ import annotations

import json
import socket
import sys

from fastapi import APIRouter

import app_toolkit as tk
from app_toolkit._runtime.backends.ray import stored
from app_toolkit._runtime.channel.tls import client_context, tls_files
from app_toolkit._runtime.messages import ReplicaInfo
from app_toolkit._runtime.tables import ReplicaTable
from tests import plain_http
from tests.deployments import as_deployment
from tests.waiting import wait_for


@tk.deployment
class Echo:
    def __call__(self, text: str) -> str:
        return text.upper()


echo_deployment = as_deployment(Echo)
router = APIRouter()


@router.get("/shout")
async def shout(text: str, echo: tk.DeploymentHandle = tk.Depends(echo_deployment)) -> str:
    shouted: str = await echo.remote(text)
    return shouted


def _stored_replicas() -> list[ReplicaInfo]:
    """Every replica in the tables the controller stored, once there are two."""
    tables = stored.load_tables()
    found = [
        info
        for table in (tables[1].values() if tables else ())
        if isinstance(table, ReplicaTable)
        for info in table.replicas
    ]
    return found if len(found) == 2 else []


def main(port: int) -> None:
    seen: dict[str, object] = {}
    tk.start(http_options={"host": "127.0.0.1", "port": port})
    tk.run(tk.App(router, name="tls"), name="tls")
    # Proxy -> ingress replica -> Echo replica: two data-plane hops.
    response = plain_http.get(f"http://127.0.0.1:{port}/shout", params={"text": "hi"}, timeout=30)
    seen["http"] = [response.status_code, response.json()]
    replicas = wait_for(_stored_replicas, 30, "both replicas in the stored tables")
    seen["replicas_tls"] = sorted({info.tls for info in replicas})
    files = tls_files()
    assert files is not None
    versions = []
    for info in replicas:  # each replica's port completes a TLS handshake with the cluster's CA
        with socket.create_connection((info.host, info.port), timeout=10) as raw:
            with client_context(files).wrap_socket(raw) as wrapped:
                versions.append(wrapped.version())
    seen["handshakes"] = versions
    tk.shutdown()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
