"""Each node's proxy as ``status()`` shows it: Ray Serve's ``ProxyStatus`` and the URL it
serves on. The backend that runs the proxies (on Ray, ``backends/ray/proxies.py``)
records what happens to them; the controller reads them.

A proxy is STARTING from when it is made until it first answers that it serves; HEALTHY
while it serves; UNHEALTHY when it did not answer (until it answers again); DRAINING
while its node leaves: it still serves, its ``/-/healthz`` answers 503, and it stops once
the node runs none of its replicas, when it leaves the table. Ray Serve's DRAINED (a
proxy drained, a moment before it is removed) is never shown, in Ray Serve either.
"""

from __future__ import annotations

from dataclasses import dataclass

from app_toolkit.status import ProxyStatus

__all__ = ["ProxyStates"]


@dataclass(slots=True)
class _Proxy:
    url: str = ""  # where it serves ("": not serving now)
    answered: bool = False  # it answered at least once (else it is starting)
    leaving: bool = False  # its node leaves


class ProxyStates:
    """The proxies of the toolkit's nodes: node id -> what ``status()`` says of its proxy."""

    def __init__(self) -> None:
        self._proxies: dict[str, _Proxy] = {}

    def starting(self, node: str) -> None:
        """A proxy was made on ``node`` (none was there)."""
        self._proxies[node] = _Proxy()

    def serving(self, node: str, url: str) -> None:
        """``node``'s proxy answered that it serves at ``url``."""
        proxy = self._proxies.setdefault(node, _Proxy())
        proxy.url, proxy.answered = url, True

    def not_serving(self, node: str) -> None:
        """``node``'s proxy did not answer that it serves."""
        proxy = self._proxies.setdefault(node, _Proxy())
        proxy.url, proxy.answered = "", True

    def leaving(self, node: str) -> None:
        """``node`` leaves: its proxy was told (it serves on until it is removed)."""
        if node in self._proxies:
            self._proxies[node].leaving = True

    def removed(self, node: str) -> None:
        """``node``'s proxy was stopped (drained, or its node gone)."""
        self._proxies.pop(node, None)

    def statuses(self) -> dict[str, ProxyStatus]:
        """Node id -> its proxy's status, as Ray Serve's ``status().proxies``."""
        return {node: _status(proxy) for node, proxy in self._proxies.items()}

    def urls(self) -> dict[str, str]:
        """Node id -> the URL its proxy serves on, for the proxies that serve."""
        return {node: proxy.url for node, proxy in self._proxies.items() if proxy.url}


def _status(proxy: _Proxy) -> ProxyStatus:
    if not proxy.answered:
        return ProxyStatus.STARTING
    if not proxy.url:
        return ProxyStatus.UNHEALTHY
    return ProxyStatus.DRAINING if proxy.leaving else ProxyStatus.HEALTHY
