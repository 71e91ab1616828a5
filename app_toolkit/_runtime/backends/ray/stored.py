"""What the toolkit keeps in Ray's GCS key-value store, which outlives every toolkit
actor: the controller's desired state, the tables it last published, and the port the
proxies share.

A restarted controller reloads the desired state. A proxy that Ray restarts while the
controller is down serves again from the stored tables and port without waiting for it.
"""

from __future__ import annotations

import pickle
import time

from app_toolkit._runtime.backends.ray import ray_compat
from app_toolkit._runtime.backends.ray.cluster import NAMESPACE
from app_toolkit._runtime.tables import Table

CHECKPOINT_KEY = b"app_toolkit/desired_state"
TABLES_KEY = b"app_toolkit/tables"
PROXY_PORT_KEY = b"app_toolkit/proxy_port"


def put(key: bytes, data: bytes) -> None:
    ray_compat.kv_put(key, data, NAMESPACE)


def get(key: bytes) -> bytes | None:
    data = ray_compat.kv_get(key, NAMESPACE)
    return data if data else None


def forget_serving_state() -> None:
    """At shutdown: drop the stored tables and port, so nothing starts from them later."""
    for key in (TABLES_KEY, PROXY_PORT_KEY):
        ray_compat.kv_del(key, NAMESPACE)


def save_tables(tables: dict[str, Table]) -> None:
    """Store the published tables, with the time they were stored."""
    put(TABLES_KEY, pickle.dumps((time.time(), tables)))


def load_tables() -> tuple[float, dict[str, Table]] | None:
    """The stored tables and when they were stored; None if there are none."""
    data = get(TABLES_KEY)
    if data is None:
        return None
    stored_at, tables = pickle.loads(data)
    return float(stored_at), dict(tables)


def save_proxy_port(port: int) -> None:
    put(PROXY_PORT_KEY, str(port).encode())


def load_proxy_port() -> int | None:
    data = get(PROXY_PORT_KEY)
    return int(data) if data else None
