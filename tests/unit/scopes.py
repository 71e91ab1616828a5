"""ASGI scopes for tests that drive an app or the front in process."""

from __future__ import annotations

from typing import Any


def http_scope(
    path: str, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None
) -> dict[str, Any]:
    """A GET to ``path`` as a server would hand it to its app."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": list(headers or []),
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1234),
    }
