"""Link probes along the real path (device -> broker -> peer), echoed on the network thread."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from edgeagent.errors import TrainingError
from edgeagent.protocol.messages import Probe
from edgeagent.protocol.topics import Family
from edgeagent.transport.hosts import is_nearby

if TYPE_CHECKING:
    from edgeagent.runtime.role import Role

log = logging.getLogger(__name__)

MAX_BANDWIDTH = 10e9  # bytes/s; a measurement above this is noise (the transfer time vanished in jitter)


_PROBE_SIZES = (64 * 1024, 256 * 1024, 1024 * 1024)  # bytes of the big probe, smallest first

# The shortest delayed-ACK timer (Linux 40 ms; macOS and Windows 100-200 ms), with room for timer slack.
NAGLE_MIN_RTT = 0.030
NAGLE_MIN_BANDWIDTH = 10e6  # bytes/s
BROKER_FIX = "set_tcp_nodelay true"


def nagle_bound(rtt_small: float, bandwidth: float, *, nearby: bool) -> bool:
    """Whether the fastest round trip of a tiny probe shows Nagle-bound delivery.

    A sender with Nagle's algorithm on (the broker's socket) holds a small packet while an earlier one
    is unacknowledged, and the receiver delays that ACK by a timer (Linux 40 ms, macOS and Windows
    100-200 ms): every round trip of a small message then takes a timer's worth, on any path, while big
    transfers still run at the path's rate. A tiny probe's fastest round trip of 30 ms or more is that
    signature where no path explains it: through a broker on loopback or the LAN (``nearby``), or over
    a path that moves 10 MB/s or more (a high-delay path that fast is a long-haul fibre link, not an
    edge device's; a broker beyond the LAN on a slower path is not judged, its latency may be real).
    """
    return rtt_small >= NAGLE_MIN_RTT and (nearby or bandwidth >= NAGLE_MIN_BANDWIDTH)


class LinkProbes:
    """Measures the real path to a peer (device -> broker -> peer) and echoes the peers' probes.

    Echoes are sent from the network thread, so a busy training loop does not distort a peer's
    measurement. Bandwidth = (big - small bytes) / (rtt(big) - rtt(small)); latency = rtt(small) / 2.
    """

    def __init__(self, role: Role) -> None:
        self.role = role
        self._waiters: dict[int, threading.Event] = {}
        self._nonce = 0
        self._lock = threading.Lock()
        self._topics: set[str] = set()
        self.nagle_warned = False  # said once per role (a process runs one): see _check_nagle

    def watch(self, peer: str) -> None:
        """Listen to ``peer``'s probe topic: its probes to us and its echoes of ours."""
        topic = self.role.topics.device(Family.PROBE, peer)
        if topic not in self._topics:
            self._topics.add(topic)
            self.role.transport.subscribe(topic, self._on_probe)

    def unwatch_all(self) -> None:
        for topic in self._topics:
            self.role.transport.unsubscribe(topic)
        self._topics.clear()

    def _on_probe(self, topic: str, payload: bytes) -> None:
        # The role's limits apply here too (size, rate, sender), except the inbox: probes are not queued.
        accepted = self.role.intake.accept(topic, payload, queued=False)
        if accepted is None:
            return
        msg = accepted[2]
        if not isinstance(msg, Probe) or msg.target != self.role.device_id:
            return
        if msg.reply:
            with self._lock:
                event = self._waiters.get(msg.nonce)
            if event is not None:
                event.set()
            return
        echo = Probe(source=self.role.device_id, target=msg.source, nonce=msg.nonce, reply=True)
        self.role.send(self.role.topics.device(Family.PROBE, self.role.device_id), echo)

    def _round_trip(self, target: str, size: int, timeout: float) -> float:
        with self._lock:
            self._nonce += 1
            nonce = self._nonce
            event = self._waiters[nonce] = threading.Event()
        probe = Probe(source=self.role.device_id, target=target, nonce=nonce, padding=bytes(size))
        started = time.perf_counter()
        self.role.send(self.role.topics.device(Family.PROBE, self.role.device_id), probe)
        ok = event.wait(timeout)
        elapsed = time.perf_counter() - started
        with self._lock:
            del self._waiters[nonce]
        if not ok:
            raise TrainingError(f"no probe echo from {target} within {timeout:.0f} s")
        return elapsed

    def measure(
        self, target: str, *, rounds: int = 5, small: int = 64, timeout: float = 30.0
    ) -> tuple[float, float]:
        """Return ``(bandwidth bytes/s, latency s)`` of the path to ``target``.

        The fastest of ``rounds`` round trips of each size is used: queueing behind other traffic only
        ever adds time. The big probe is the smallest of 64 KiB, 256 KiB and 1 MiB whose transfer takes
        at least 0.15 s at the rate a 64 KiB trial suggests (1 MiB at most): well above loopback jitter
        and the stalls of a CPU quota (a quarter-core cgroup stops a process for 75 ms of every 100 ms),
        without minutes of probing on a slow link.
        """
        self.watch(target)
        self._warm_up(target, small, timeout)
        trial = self._round_trip(target, _PROBE_SIZES[0], timeout) - self._round_trip(target, small, timeout)
        rate = _PROBE_SIZES[0] / max(trial, 1e-6)
        big = next((size for size in _PROBE_SIZES if size / rate >= 0.15), _PROBE_SIZES[-1])
        # All the rounds where they are quick (a fast link); three where each takes 0.15 s or more.
        quick = big / rate < 0.15
        smalls, bigs = [], []
        for _ in range(rounds if quick else min(rounds, 3)):
            smalls.append(self._round_trip(target, small, timeout))
            bigs.append(self._round_trip(target, big, timeout))
        rtt_small, rtt_big = min(smalls), min(bigs)
        bandwidth = (big - small) / max(rtt_big - rtt_small, (big - small) / MAX_BANDWIDTH)
        self._check_nagle(target, rtt_small, bandwidth, small)
        return bandwidth, rtt_small / 2

    def _check_nagle(self, target: str, rtt_small: float, bandwidth: float, small: int) -> None:
        """Say once, loudly, that the broker holds small messages back, and the line that fixes it.

        Our clients re-arm ``TCP_QUICKACK`` after each read (:mod:`edgeagent.transport.mqtt`), which
        hides the broker's Nagle on Linux; when the probes still show it (a system without the option,
        a peer on an older edgeagent), only the broker can fix it: every activation, gradient and
        acknowledgement waits a delayed-ACK timer per hop, several times slower training.
        """
        if getattr(self.role.transport, "quickack", False):
            # Our ACKs release what the broker holds: a slow small round trip here is something else (8
            # processes on 2 cores at start-up measured 33-39 ms through the embedded broker, and this
            # said "SLOW BROKER" of a broker that holds nothing).
            return
        address = getattr(self.role.transport, "broker_address", None)
        nearby = isinstance(address, str) and is_nearby(address)
        if self.nagle_warned or not nagle_bound(rtt_small, bandwidth, nearby=nearby):
            return
        self.nagle_warned = True
        url = getattr(self.role.transport, "url", None)
        broker = url.redacted() if url is not None and hasattr(url, "redacted") else "the broker"
        log.warning(
            "SLOW BROKER: a %d-byte probe to %s through %s (%s) takes %.0f ms there and back on a path "
            "that moves %.0f MB/s: the broker holds small packets back (Nagle's algorithm) until a delayed "
            "ACK, tens of ms per message, and training runs several times slower. If it is Mosquitto, add "
            "this line to its mosquitto.conf and restart it: `%s` (other brokers: turn on TCP_NODELAY for "
            "client connections)",
            small,
            target,
            broker,
            address or "address unknown",
            rtt_small * 1e3,
            bandwidth / 1e6,
            BROKER_FIX,
        )

    def _warm_up(self, target: str, size: int, timeout: float) -> None:
        """The first round trip, retried: the echo of a probe sent before our subscription to the peer's
        probe topic (or the peer's to ours) was active at the broker is lost, not late."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self._round_trip(target, size, min(2.0, max(0.1, left)))
                return
            except TrainingError:
                if time.monotonic() >= deadline:
                    raise TrainingError(f"no probe echo from {target} within {timeout:.0f} s") from None
