"""The Nagle signature of the link probes as a pure rule (a real broker: protocol/test_stock_broker)."""

from __future__ import annotations

from edgeagent.runtime.probes import NAGLE_MIN_BANDWIDTH, NAGLE_MIN_RTT, nagle_bound
from edgeagent.transport.hosts import is_nearby


def test_a_held_small_message_on_a_nearby_broker_is_the_signature() -> None:
    assert nagle_bound(0.044, 270e6, nearby=True)  # stock Mosquitto on loopback, measured
    assert not nagle_bound(0.0005, 150e6, nearby=True)  # the same broker with set_tcp_nodelay
    assert not nagle_bound(NAGLE_MIN_RTT * 0.9, 1e6, nearby=True)


def test_a_far_broker_is_judged_by_its_rate() -> None:
    # 40 ms over a few Mbit/s is a real long path; over 10 MB/s and more it is a held packet.
    assert not nagle_bound(0.040, 0.5e6, nearby=False)
    assert not nagle_bound(0.040, NAGLE_MIN_BANDWIDTH * 0.9, nearby=False)
    assert nagle_bound(0.040, NAGLE_MIN_BANDWIDTH, nearby=False)


def test_nearby_addresses() -> None:
    nearby = ("127.0.0.1", "::1", "192.168.1.20", "10.0.0.5", "172.16.3.4", "fe80::1%eth0", "localhost")
    for address in nearby:
        assert is_nearby(address), address
    for address in ("8.8.8.8", "2001:4860:4860::8888", "broker.example.com"):
        assert not is_nearby(address), address


class _Transport:
    def __init__(self, quickack: bool) -> None:
        self.quickack = quickack
        self.broker_address = "127.0.0.1"


class _Role:
    def __init__(self, quickack: bool) -> None:
        self.transport = _Transport(quickack)


def test_no_judgement_while_our_quickack_hides_the_brokers_nagle() -> None:
    """With our ACKs re-armed a slow small round trip is CPU load, not a held packet: 8 processes on 2
    cores measured 33-39 ms through the embedded broker and were told the broker held packets."""
    from typing import Any

    from edgeagent.runtime.probes import LinkProbes

    role: Any = _Role(quickack=True)
    probes = LinkProbes(role)
    probes._check_nagle("peer", 0.039, 10e9, 64)
    assert not probes.nagle_warned
    role = _Role(quickack=False)
    probes = LinkProbes(role)
    probes._check_nagle("peer", 0.039, 10e9, 64)
    assert probes.nagle_warned
