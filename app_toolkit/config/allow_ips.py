"""The IP allow lists of ``HTTPOptions`` (``metrics_allow_ips``, ``dashboard_allow_ips``):
the option's text read as networks, and a client checked against them. The config
validates the text with the same parser the front then applies (``front/pages.py``,
``front/dashboard.py``)."""

from __future__ import annotations

import ipaddress

#: The networks an allow list admits; None admits anyone (``"*"``).
Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None


def parse_networks(text: str) -> Networks:
    """``"127.0.0.1, ::1, 10.0.0.0/8"`` → networks; ``"*"`` → None (anyone). Raises
    ValueError naming a bad entry."""
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    if "*" in entries:
        return None
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or network (like 10.0.0.0/8)") from None
    return tuple(networks)


def allowed(networks: Networks, client: str | None) -> bool:
    """Whether the client at address ``client`` (None: unknown) is in ``networks``; an
    IPv4 client on a dual-stack socket counts as its IPv4 address."""
    if networks is None:
        return True
    if client is None:
        return False
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)
