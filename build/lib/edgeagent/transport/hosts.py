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
