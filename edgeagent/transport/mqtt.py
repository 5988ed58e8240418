"""MQTT transport on paho-mqtt (VERSION2 callbacks, MQTT 3.1.1), for any standard broker."""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edgeagent.errors import ConfigError, ProtocolError
from edgeagent.protocol.chunking import DEFAULT_CHUNK_SIZE, Reassembler, is_chunk, split_payload
from edgeagent.transport.base import Transport
from edgeagent.transport.hosts import is_loopback
from edgeagent.transport.pacing import LinkThrottle, bulk_frame_bytes

log = logging.getLogger(__name__)

DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}


@dataclass(frozen=True)
class BrokerUrl:
    """``mqtt://[user:pass@]host:port`` or ``mqtts://...`` for TLS."""

    scheme: str
    host: str
    port: int
    username: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme == "mqtts"

    @classmethod
    def parse(cls, url: str) -> BrokerUrl:
        parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        if parts.scheme not in DEFAULT_PORTS:
            raise ConfigError(f"broker URL {url!r}: scheme must be mqtt:// or mqtts://, got {parts.scheme!r}")
        try:
            port = parts.port or DEFAULT_PORTS[parts.scheme]
        except ValueError as exc:
            raise ConfigError(f"broker URL {url!r}: bad port") from exc
        if not parts.hostname:
            raise ConfigError(f"broker URL {url!r} has no host")
        return cls(
            scheme=parts.scheme,
            host=parts.hostname,
            port=port,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )

    def redacted(self) -> str:
        user = f"{self.username}:***@" if self.username else ""
        return f"{self.scheme}://{user}{self.host}:{self.port}"

    def check_password_safe(self, *, encrypted: bool = False, insecure_plaintext: bool = False) -> None:
        """Refuse (:class:`ConfigError`) to send a password in plain TCP (neither ``mqtts://`` nor
        ``encrypted``: TLS options given) to a host beyond loopback: anyone on the path reads it, and with
        it can log in as this device. ``insecure_plaintext`` sends it anyway, with a warning."""
        if self.password is None or self.tls or encrypted or is_loopback(self.host):
            return
        where = f"{self.host}:{self.port}"
        if not insecure_plaintext:
            raise ConfigError(
                f"refusing to send the broker password of {self.username!r} in plain text over mqtt:// to "
                f"{where}, beyond loopback: use mqtts://{self.host}:8883 with --ca-file (the site CA, "
                "`edgeagent certs`), or pass --insecure-plaintext (insecure_plaintext: true) to accept that"
            )
        log.warning(
            "INSECURE: sending the broker password of %r in plain text to %s (--insecure-plaintext); "
            "use mqtts:// with --ca-file",
            self.username,
            where,
        )


@dataclass(frozen=True)
class TlsOptions:
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def _client_tls_context(opts: TlsOptions) -> ssl.SSLContext:
    """TLS 1.2 or later; the broker's certificate must chain to ``ca_file`` (the system's CAs without
    it) and name the host of the broker URL (a DNS name or an IP address in its subjectAltName)."""
    if opts.key_file is not None and opts.cert_file is None:
        raise ConfigError(f"a TLS key file ({opts.key_file}) needs its certificate file too")
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=opts.ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if opts.cert_file is not None:
            context.load_cert_chain(opts.cert_file, opts.key_file)
    except (OSError, ssl.SSLError) as exc:  # a missing file, or a key that does not match its certificate
        files = ", ".join(f"{k}={v}" for k, v in vars(opts).items() if v is not None) or "system CAs"
        raise ConfigError(f"cannot load the TLS files ({files}): {exc}") from exc
    return context


# Linux only: acknowledge received data at once instead of after the delayed-ACK timer (40 ms or more).
TCP_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def _arm_quickack(sock: Any) -> None:
    if TCP_QUICKACK is not None and sock is not None:
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)


class _QuickAckClient(mqtt.Client):
    """paho's client that acknowledges every read at once (``TCP_QUICKACK`` re-armed after each).

    Note: a broker with Nagle's algorithm on (Mosquitto as Debian installs it: no ``set_tcp_nodelay``)
    holds a small packet to us (a PUBACK, a forwarded PUBLISH) while an earlier one is unacknowledged,
    and our kernel delays that ACK by 40 ms or more, hoping to piggyback it on a reply that may never
    come. Every hop then costs ~40 ms (measured through a stock Mosquitto on loopback: 64-byte QoS 1
    round trip 42-48 ms; with this 0.3-0.4 ms, as with ``set_tcp_nodelay true``). Linux clears the
    option again by itself once the exchange looks interactive, so it is set after every read, one
    system call per read; on other systems it does not exist and the probes warn instead
    (:mod:`edgeagent.runtime.probes`).
    """

    quickack = True
    direct_write = False  # write PUBLISH packets from the publishing thread (plain TCP only; see below)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write_lock = threading.Lock()

    def _packet_write(self) -> mqtt.MQTTErrorCode:
        # One writer at a time: the network thread, or a publishing thread (direct_write).
        with self._write_lock:
            return super()._packet_write()

    def _packet_queue(
        self,
        command: int,
        packet: bytes | bytearray,
        mid: int,
        qos: int,
        info: mqtt.MQTTMessageInfo | None = None,
    ) -> mqtt.MQTTErrorCode:
        """paho queues every packet for its network thread and wakes it: one thread hand-off (and a wait
        for the GIL) per activation. With ``direct_write`` a PUBLISH from another thread is written at
        once by that thread; what does not fit the socket's buffer is left to the network thread, woken
        then. Not for TLS (an SSL connection must not be read and written from two threads at once).

        The network thread's own packets (the PUBACK of every QoS 1 message it receives) are written at
        once too: paho would wake its own thread through the socket pair (a send, a select, a recv) to
        write them in the next round. If another thread is writing meanwhile (or the network thread
        itself, from inside a write), the packet waits in the queue, and the network thread's next
        select, which watches the socket for writing while anything is queued, sends it. Not inside one
        of paho's callbacks (a message handler's PUBLISH, say a probe's echo; the SUBSCRIBEs of
        ``on_connect``): paho runs them holding its callback lock, and a write that drains a queued
        DISCONNECT (a close racing it) reports the disconnection under that same lock, which is not
        re-entrant: the network thread would wait for itself for ever."""
        if not self.direct_write or self._thread is None:
            return super()._packet_queue(command, packet, mid, qos, info)
        on_thread = threading.current_thread() is self._thread
        if (on_thread and self._in_callback_mutex.locked()) or (
            not on_thread and command & 0xF0 != mqtt.PUBLISH
        ):
            return super()._packet_queue(command, packet, mid, qos, info)
        self._out_packet.append(
            {
                "command": command,
                "mid": mid,
                "qos": qos,
                "pos": 0,
                "to_process": len(packet),
                "packet": packet,
                "info": info,
            }
        )
        if on_thread:
            if self._write_lock.acquire(blocking=False):
                try:
                    mqtt.Client._packet_write(self)
                finally:
                    self._write_lock.release()
            return mqtt.MQTT_ERR_SUCCESS
        rc = self._packet_write()
        if rc != mqtt.MQTT_ERR_SUCCESS or self._out_packet:  # the rest (or the error) is the thread's
            sock = self._sockpairW
            if sock is not None:
                with contextlib.suppress(BlockingIOError, OSError):
                    sock.send(b"0")
        return mqtt.MQTT_ERR_SUCCESS

    def loop_read(self, max_packets: int = 1) -> mqtt.MQTTErrorCode:
        rc = super().loop_read(max_packets)
        if self.quickack:
            _arm_quickack(self.socket())
        return rc


class MqttTransport(Transport):
    """One paho client. Reconnects by itself with capped, jittered backoff and resubscribes."""

    def __init__(
        self,
        url: str | BrokerUrl,
        client_id: str,
        *,
        will: tuple[str, bytes] | None = None,
        keepalive: int = 10,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_message: int = 256 * 1024 * 1024,
        tls: TlsOptions | None = None,
        max_backoff: float = 5.0,
        link_mbps: float = 0.0,
        insecure_plaintext: bool = False,
        quickack: bool = True,
    ) -> None:
        super().__init__(client_id)
        self.url = url if isinstance(url, BrokerUrl) else BrokerUrl.parse(url)
        self.url.check_password_safe(encrypted=tls is not None, insecure_plaintext=insecure_plaintext)
        self.chunk_size = chunk_size
        self.max_message = max_message
        self.max_backoff = max_backoff
        self._reassembler = Reassembler(max_message=max_message)
        self._reassembly_lock = threading.Lock()
        self._is_connected = threading.Event()
        self._closed = False
        self.dropped = 0  # payloads dropped as malformed or oversized, for tests and metrics
        self.refusals = 0  # connection attempts the broker refused in a row (bad credentials)
        self._last_sent: mqtt.MQTTMessageInfo | None = None
        self._pending_subscriptions: dict[int, str] = {}  # SUBSCRIBE message id -> filter
        self._subs_lock = threading.Lock()
        self.refused_subscriptions: set[str] = set()  # filters the broker refused (no right to read)
        self.close_timeout = 2.0
        self.throttle = LinkThrottle(link_mbps) if link_mbps > 0 else None
        # The bulk lane (publish_bulk): the newest payload of every key waiting, sent by its own thread.
        self._bulk: dict[str, tuple[str, bytes, float]] = {}
        self._bulk_ready = threading.Condition()
        self._bulk_thread: threading.Thread | None = None
        self.bulk_superseded = 0  # bulk payloads replaced by a newer one of their key before they left
        client = _QuickAckClient(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311, clean_session=True
        )
        client.quickack = quickack  # off only to show what a stock broker costs without it (tests, bench)
        client.direct_write = not (self.url.tls or tls is not None)
        # Whether a broker's Nagle is hidden from us: the probes judge the Nagle signature only when not.
        self.quickack = quickack and TCP_QUICKACK is not None
        if self.url.username:
            client.username_pw_set(self.url.username, self.url.password)
        if self.url.tls or tls is not None:
            client.tls_set_context(_client_tls_context(tls or TlsOptions()))
        if will is not None:
            client.will_set(will[0], will[1], qos=1, retain=True)
        client.on_socket_open = self._handle_socket_open
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_message = self._handle_message
        client.on_subscribe = self._handle_subscribe
        client.reconnect_delay_set(min_delay=1, max_delay=max(1, int(max_backoff)))
        client.max_inflight_messages_set(64)
        self._client = client
        client.connect_async(self.url.host, self.url.port, keepalive=keepalive)
        client.loop_start()

    def loop_alive(self) -> bool:
        """Whether paho's network thread is still running (it is what the watchdog guards)."""
        thread = getattr(self._client, "_thread", None)
        return thread is not None and thread.is_alive()

    @property
    def broker_address(self) -> str | None:
        """The IP address the connection to the broker reached (the URL's host resolved), if connected."""
        with contextlib.suppress(OSError, AttributeError, IndexError):
            sock: Any = self._client.socket()  # a socket (TCP, TLS); paho types it as a protocol
            if sock is not None:
                return str(sock.getpeername()[0])
        return None

    def set_link_mbps(self, mbps: float) -> None:
        """Change the emulated uplink (0: none) while running (device profiles)."""
        self.throttle = LinkThrottle(mbps) if mbps > 0 else None

    def pace_uplink(self, mbps: float) -> bool:
        """The bulk lane paced on this device's real uplink, measured at ``mbps``: every frame is booked on
        a model of the link (not held back: the link holds it) and bulk frames go in its idle time. Not
        over an emulated uplink (that one paces already). Returns whether the lane is paced now."""
        if self.throttle is not None and self.throttle.emulate:
            return True
        self.throttle = LinkThrottle(mbps, emulate=False) if mbps > 0 else None
        return self.throttle is not None

    # -- Transport -----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._is_connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._is_connected.wait(timeout)

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        if len(payload) > self.max_message:
            raise ProtocolError(f"refusing to send {len(payload)} bytes to {topic}: limit {self.max_message}")
        if retain and len(payload) > self.chunk_size:
            # A broker keeps one retained message per topic: only the last chunk would survive.
            raise ProtocolError(
                f"retained payload to {topic} is {len(payload)} bytes; limit {self.chunk_size}"
            )
        for frame in split_payload(payload, self.chunk_size):
            if self.throttle is not None:
                self.throttle.wait(len(frame))
            info = self._client.publish(topic, frame, qos=qos, retain=retain)
            if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
                log.warning("publish to %s failed: %s", topic, mqtt.error_string(info.rc))
            elif qos > 0:
                self._last_sent = info

    def publish_bulk(self, key: str, topic: str, payload: bytes, *, share: float) -> None:
        """Queue ``payload`` on the bulk lane: without an emulated uplink (or with ``share`` 0) it is sent
        at once, as :meth:`publish`; with one, a thread sends it in short frames (:func:`bulk_frame_bytes`)
        in the link's idle time within ``share`` of its rate (:meth:`LinkThrottle.wait_bulk`), so activations
        and gradients wait behind at most one such frame. A payload of ``key`` not yet started gives
        way to a newer one (the newest replica is the one worth having)."""
        if self.throttle is None or share <= 0:
            self.publish(topic, payload)
            return
        if len(payload) > self.max_message:
            raise ProtocolError(f"refusing to send {len(payload)} bytes to {topic}: limit {self.max_message}")
        with self._bulk_ready:
            if key in self._bulk:
                self.bulk_superseded += 1
                del self._bulk[key]  # the newest goes to the back of the queue
            self._bulk[key] = (topic, payload, share)
            if self._bulk_thread is None:
                self._bulk_thread = threading.Thread(target=self._bulk_loop, name="bulk-lane", daemon=True)
                self._bulk_thread.start()
            self._bulk_ready.notify()

    def cancel_bulk(self) -> int:
        with self._bulk_ready:
            dropped = len(self._bulk)
            self._bulk.clear()
        return dropped

    def _bulk_loop(self) -> None:
        while True:
            with self._bulk_ready:
                while not self._bulk and not self._closed:
                    self._bulk_ready.wait(1.0)
                if self._closed:
                    return
                key = next(iter(self._bulk))
                topic, payload, share = self._bulk.pop(key)
            rate = self.throttle.bytes_per_second if self.throttle is not None else None
            size = self.chunk_size if rate is None else bulk_frame_bytes(rate, self.chunk_size)
            for frame in split_payload(payload, size):
                throttle = self.throttle
                if self._closed:
                    return
                if throttle is not None:
                    throttle.wait_bulk(len(frame), share)
                info = self._client.publish(topic, frame, qos=1)
                if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
                    log.warning("bulk publish to %s failed: %s", topic, mqtt.error_string(info.rc))

    def flush(self, timeout: float) -> bool:
        """Wait for the broker to acknowledge the last QoS 1 message (paho sends in order)."""
        last = self._last_sent
        if last is None or not self.connected:
            return last is None
        with contextlib.suppress(RuntimeError, ValueError):
            last.wait_for_publish(timeout)
        return last.is_published()

    def _subscribe_remote(self, pattern: str) -> None:
        if self.connected:
            self._send_subscribe(pattern)

    def _send_subscribe(self, pattern: str) -> None:
        # Under the lock: on a busy machine the SUBACK can reach _handle_subscribe before subscribe()
        # returns its message id, and a refusal would then go unnoticed. paho's subscribe only queues the
        # packet; the network thread takes no lock of its own that this waits for.
        with self._subs_lock:
            _, mid = self._client.subscribe(pattern, qos=1)
            if mid is not None:
                self._pending_subscriptions[mid] = pattern

    def _unsubscribe_remote(self, pattern: str) -> None:
        if self.connected:
            self._client.unsubscribe(pattern)

    def close(self) -> None:
        """Disconnect cleanly (no last will is sent) and stop the network thread."""
        if self._closed:
            return
        # The last words (a run's "stop", an "offline" status) must reach the broker before we hang up:
        # wait a little for the broker to acknowledge the last QoS 1 message.
        self.flush(self.close_timeout)
        self._closed = True
        with self._bulk_ready:
            self._bulk_ready.notify_all()
        try:
            self._client.disconnect()
        finally:
            self._client.loop_stop()
            self._is_connected.clear()

    def kill(self) -> None:
        """Drop the connection without DISCONNECT so that the broker publishes the last will (tests)."""
        self._closed = True
        sock = self._client.socket()
        self._client.loop_stop()
        if sock is not None:
            sock.close()
        self._is_connected.clear()

    # -- paho callbacks (network thread) -----------------------------------------------------

    @staticmethod
    def _handle_socket_open(client: mqtt.Client, userdata: object, sock: Any) -> None:
        # paho leaves Nagle's algorithm on: a small PUBLISH then waits for the peer's delayed ACK, which
        # measured 40-90 ms per hop on loopback. Activations, gradients and probes must not wait.
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The other direction is the broker's Nagle waiting on our delayed ACKs: _QuickAckClient.
        if getattr(client, "quickack", False):
            _arm_quickack(sock)

    def _handle_connect(
        self, client: mqtt.Client, userdata: object, flags: object, rc: object, props: object
    ) -> None:
        if getattr(rc, "is_failure", False):
            self.refusals += 1
            if self.refusals == 1 or self.refusals % 60 == 0:
                log.error(
                    "broker %s refused %s: %s (%d times so far; check this device's user name, password "
                    "file and client id against `edgeagent credentials list` on the broker); retrying "
                    "every %.0f s",
                    self.url.redacted(),
                    self.client_id,
                    rc,
                    self.refusals,
                    self.max_backoff,
                )
            return
        self.refusals = 0
        log.debug("%s connected to %s", self.client_id, self.url.redacted())
        self._client.reconnect_delay_set(min_delay=1, max_delay=max(1, int(self.max_backoff)))
        # Connected first, then resubscribe: a subscribe() racing with this sees "connected" and sends
        # its own SUBSCRIBE; one sent twice is harmless, one never sent would be lost until a reconnect.
        self._is_connected.set()
        for pattern in self._patterns():
            self._send_subscribe(pattern)
        self._connected()

    def _handle_disconnect(
        self, client: mqtt.Client, userdata: object, flags: object, rc: object, props: object
    ) -> None:
        self._is_connected.clear()
        if self._closed:
            return
        if self.refusals:  # refused logins retry slowly: the credentials may be added on the broker later
            slow = max(1, int(self.max_backoff))
            client.reconnect_delay_set(min_delay=slow, max_delay=slow)
            return
        # Jitter the first retry so that a cluster does not reconnect in lock-step after a broker restart.
        jittered: Any = random.uniform(0.2, 1.0)  # paho annotates int but sleeps on any number
        client.reconnect_delay_set(min_delay=jittered, max_delay=max(1, int(self.max_backoff)))
        log.warning("%s lost the broker %s (%s); reconnecting", self.client_id, self.url.redacted(), rc)

    def _handle_subscribe(
        self, client: mqtt.Client, userdata: object, mid: int, codes: list[Any], props: object
    ) -> None:
        with self._subs_lock:
            pattern = self._pending_subscriptions.pop(mid, None)
        if pattern is None or not any(getattr(rc, "is_failure", False) for rc in codes):
            return
        # Logged before it is recorded: whoever sees the refusal in refused_subscriptions also finds it
        # in the log.
        log.error(
            "broker %s refused %s the subscription to %s: this login may not read it (check its role and "
            "cluster with `edgeagent credentials list` on the broker); nothing from there will arrive",
            self.url.redacted(),
            self.client_id,
            pattern,
        )
        self.refused_subscriptions.add(pattern)

    def _handle_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        payload = bytes(message.payload)
        topic = message.topic
        if len(payload) > self.max_message:
            self.dropped += 1
            log.warning(
                "dropped %d bytes on %s: over the %d-byte limit", len(payload), topic, self.max_message
            )
            return
        if is_chunk(payload):
            try:
                with self._reassembly_lock:
                    whole = self._reassembler.feed(topic, payload)
            except ProtocolError as exc:
                self.dropped += 1
                if self.dropped <= 3 or self.dropped % 100 == 0:  # a flood of bad frames: a few lines only
                    log.warning("dropped a chunk on %s: %s (%d dropped so far)", topic, exc, self.dropped)
                return
            if whole is None:
                return
            payload = whole
        self._dispatch(topic, payload)
