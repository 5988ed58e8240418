"""Whether a host is this machine's loopback: what may travel in plain TCP (a broker's listener, a
password) without TLS. Kept apart from the MQTT client so the broker command does not import paho."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``). Any other name counts as beyond
    loopback: it is not resolved, so a name that happens to point here is treated as the LAN it may be."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_nearby(address: str) -> bool:
    """A loopback, private (RFC 1918, unique local) or link-local address: one hop across a LAN at most,
    where a 64-byte round trip never takes tens of milliseconds unless something holds it back."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address == "localhost"
    return ip.is_loopback or ip.is_private or ip.is_link_local
