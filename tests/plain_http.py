"""The tests' one-off HTTP calls, with one TLS context for all of them.

httpx's module functions (``httpx.get``, ``httpx.post``, ...) build a client per call, and
with it a TLS context that reads certifi's bundle: about 30-70 ms of a core each time,
even for ``http://``. A test that polls a server with them every 50 ms spends a core on
it while it waits, on a 2-core host where the suite is CPU-bound. These are the same
calls, each still on a fresh connection, with a context made once. An explicit
``verify`` (a test's own CA) wins.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

#: The one TLS context (certifi's bundle is not read: the tests' servers are plain HTTP
#: or bring their own CA).
TLS = ssl.create_default_context()


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("verify", TLS)
    return httpx.request(method, url, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return request("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return request("POST", url, **kwargs)


@contextmanager
def stream(method: str, url: str, **kwargs: Any) -> Iterator[httpx.Response]:
    kwargs.setdefault("verify", TLS)
    with httpx.stream(method, url, **kwargs) as response:
        yield response
