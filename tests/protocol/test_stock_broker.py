"""A stock Mosquitto (Nagle's algorithm on, no ``set_tcp_nodelay``): our sockets' options, and the probes'
warning, which must fire exactly when the round trips show Nagle-bound delivery."""

from __future__ import annotations

import logging
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeagent.protocol.topics import Topics
from edgeagent.runtime.probes import BROKER_FIX, NAGLE_MIN_RTT, LinkProbes
from edgeagent.runtime.role import Role
from edgeagent.transport.mqtt import TCP_QUICKACK, MqttTransport
from tests.conftest import MosquittoProcess

pytestmark = pytest.mark.mosquitto

needs_quickack = pytest.mark.skipif(TCP_QUICKACK is None, reason="TCP_QUICKACK is Linux only")


def _broker(tmp_path: Path, *, nodelay: bool) -> Iterator[str]:
    if shutil.which("mosquitto") is None:
        pytest.skip("the mosquitto binary is not installed (apt-get install mosquitto)")
    proc = MosquittoProcess(tmp_path, nodelay=nodelay).start()
    try:
        yield proc.url
    finally:
        proc.stop()


@pytest.fixture
def stock_url(tmp_path: Path) -> Iterator[str]:
    yield from _broker(tmp_path, nodelay=False)


@pytest.fixture
def tuned_url(tmp_path: Path) -> Iterator[str]:
    yield from _broker(tmp_path, nodelay=True)


@needs_quickack
def test_our_socket_has_nodelay_and_quickack(stock_url: str) -> None:
    transport = MqttTransport(stock_url, f"opts-{uuid.uuid4().hex[:6]}")
    try:
        assert transport.wait_connected(10)
        transport.subscribe("opts/x", lambda topic, payload: None)
        sock: Any = transport._client.socket()
        assert sock is not None
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        # TCP_QUICKACK is not asserted here: Linux reads it back as 1 whenever the connection is not in
        # interactive mode, fix or no fix; the round-trip tests below are what tell them apart.
        assert transport.broker_address == "127.0.0.1"
    finally:
        transport.close()


def _probe(url: str, *, quickack: bool) -> tuple[LinkProbes, float]:
    """Probe a peer through ``url`` the way a worker measures its link; the latency found."""
    topics = Topics(f"n{uuid.uuid4().hex[:8]}")
    echo = Role(MqttTransport(url, f"echo-{topics.cluster}", quickack=quickack), topics, "peer")
    dev = Role(MqttTransport(url, f"dev-{topics.cluster}", quickack=quickack), topics, "device")
    try:
        assert echo.transport.wait_connected(10) and dev.transport.wait_connected(10)
        LinkProbes(echo).watch("device")
        probes = LinkProbes(dev)
        _, latency = probes.measure("peer")
        return probes, latency
    finally:
        echo.transport.close()
        dev.transport.close()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "SLOW BROKER" in r.getMessage()]


@needs_quickack
def test_quickack_hides_a_stock_broker_and_no_warning(
    stock_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="edgeagent.runtime.probes")
    probes, latency = _probe(stock_url, quickack=True)
    assert 2 * latency < NAGLE_MIN_RTT, f"small round trip {2 * latency * 1e3:.1f} ms through a stock broker"
    assert not probes.nagle_warned and _warnings(caplog) == []


def test_warning_when_the_probes_show_nagle(stock_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Without QUICKACK (as on a system without it) the stock broker holds every small message."""
    caplog.set_level(logging.WARNING, logger="edgeagent.runtime.probes")
    probes, latency = _probe(stock_url, quickack=False)
    assert 2 * latency >= NAGLE_MIN_RTT, f"small round trip {2 * latency * 1e3:.1f} ms: no Nagle hold?"
    assert probes.nagle_warned
    (line,) = _warnings(caplog)
    assert f"`{BROKER_FIX}`" in line and "mosquitto.conf" in line
    probes._check_nagle("peer", 2 * latency, 1e9, 64)  # measured again: said once only
    assert len(_warnings(caplog)) == 1


def test_no_warning_through_a_tuned_broker(tuned_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="edgeagent.runtime.probes")
    probes, latency = _probe(tuned_url, quickack=False)
    assert 2 * latency < NAGLE_MIN_RTT
    assert not probes.nagle_warned and _warnings(caplog) == []
