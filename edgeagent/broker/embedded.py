"""The embedded MQTT 3.1.1 broker (amqtt), run in-process on a thread or as ``edgeagent broker``.

Any standard MQTT 3.1.1 broker works instead: point every role at it with ``--broker mqtt://host:port``.
Configuration files for the embedded broker and for Mosquitto live in the repository's ``broker/``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import signal
import socket
import ssl
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeagent.broker.relay import applies as relay_applies
from edgeagent.broker.relay import run_broadcast
from edgeagent.errors import ConfigError
from edgeagent.ops.systemd import Notifier, Watchdog, watchdog_interval
from edgeagent.transport.hosts import is_loopback

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port that is free right now (for tests and the demo)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class BrokerTls:
    """A TLS listener: the broker's certificate and key; with ``ca_file``, client certificates are
    verified against that CA, and ``require_client_cert`` refuses clients that present none."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    require_client_cert: bool = False


def broker_config(
    host: str,
    port: int,
    *,
    credentials: str | None = None,
    tls: BrokerTls | None = None,
    insecure_plaintext: bool = False,
) -> dict[str, Any]:
    """The amqtt configuration.

    Anonymous clients are allowed only on a loopback listener without ``credentials``. With
    ``credentials`` (a directory made by ``edgeagent credentials``), every client must log in with a
    password and gets the topic rights of its role (:mod:`edgeagent.broker.security`). Beyond loopback
    the listener needs TLS too (the passwords and the model would cross the LAN in clear), unless
    ``insecure_plaintext`` says to listen in plain TCP anyway (logged as a warning at every start).
    """
    beyond = not is_loopback(host)
    if beyond and credentials is None:
        raise ConfigError(
            f"the broker would listen on {host}:{port}, beyond loopback, without credentials; "
            "give --credentials DIR (made by `edgeagent credentials add`) or bind to 127.0.0.1"
        )
    if beyond and tls is None:
        if not insecure_plaintext:
            raise ConfigError(
                f"the broker would listen on {host}:{port}, beyond loopback, in plain TCP: every password "
                "and tensor would cross the network in clear. Give --cert-file and --key-file (made by "
                "`edgeagent certs`; clients then use mqtts:// with --ca-file), bind to 127.0.0.1, or pass "
                "--insecure-plaintext to accept that"
            )
        log.warning(
            "INSECURE: the broker listens on %s:%d, beyond loopback, in plain TCP (--insecure-plaintext): "
            "passwords and training data cross the network unencrypted; use --cert-file/--key-file",
            host,
            port,
        )
    plugins: dict[str, Any] = {}
    if credentials is None:
        plugins["amqtt.plugins.authentication.AnonymousAuthPlugin"] = {"allow_anonymous": True}
    else:
        # Our own plugin, not amqtt's FileAuthPlugin + AnonymousAuthPlugin: it refuses a client without
        # a username (amqtt's anonymous plugin with allow_anonymous false admits any username) and
        # enforces the topic rights of each user.
        plugins["edgeagent.broker.security.SecurityPlugin"] = {"credentials": str(credentials)}
    listener: dict[str, Any] = {"type": "tcp", "bind": f"{host}:{port}", "max_connections": 256}
    if tls is not None:
        _check_tls_files(tls)
        listener.update(ssl=True, certfile=tls.cert_file, keyfile=tls.key_file)
        if tls.ca_file:
            listener["cafile"] = tls.ca_file
    return {"listeners": {"default": listener}, "plugins": plugins}


def _check_tls_files(tls: BrokerTls) -> None:
    if tls.require_client_cert and not tls.ca_file:
        raise ConfigError("require_client_cert needs ca_file: the CA that signed the client certificates")
    for what, path in (("certificate", tls.cert_file), ("key", tls.key_file), ("CA", tls.ca_file)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"the broker's TLS {what} file {path} does not exist (see `edgeagent certs`)")


def _make_broker(config: dict[str, Any], tls: BrokerTls | None) -> Any:
    """An amqtt ``Broker`` whose TLS listener needs TLS 1.2 or later and, with ``require_client_cert``,
    refuses clients that present no certificate.

    amqtt 0.12 builds the listener's context itself with ``verify_mode = CERT_OPTIONAL`` (a client
    without a certificate gets in; one with a certificate the CA did not sign is refused), and its
    listener config is a strict dataclass with no key for this; so the flag lives on the subclass.
    """
    from amqtt.broker import Broker

    fast_relay = relay_applies(importlib.metadata.version("amqtt"))

    class _Broker(Broker):
        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__(config)
            self.connections: set[asyncio.StreamWriter] = set()

        async def _run_broadcast(self, running_tasks: Any) -> None:
            if fast_relay:  # amqtt's loop without its per-message debug formatting (broker/relay.py)
                await run_broadcast(self, running_tasks)
            else:
                await super()._run_broadcast(running_tasks)

        async def stream_connected(
            self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener_name: str
        ) -> None:
            self.connections.add(writer)  # for _shut_down: amqtt keeps no list we could use
            try:
                await super().stream_connected(reader, writer, listener_name)
            finally:
                self.connections.discard(writer)

        def _create_ssl_context(self, listener: Any) -> ssl.SSLContext:
            context: ssl.SSLContext = Broker._create_ssl_context(listener)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            if tls is not None and tls.require_client_cert:
                context.verify_mode = ssl.CERT_REQUIRED
            elif tls is not None and not tls.ca_file:
                # No CA of ours to check a client certificate against: do not ask for one (amqtt would
                # otherwise verify it against the system's public CAs).
                context.verify_mode = ssl.CERT_NONE
            return context

    return _Broker(config)


SHUTDOWN_GRACE_S = 5.0  # for amqtt's own shutdown; then the connections are closed under it
# amqtt starting its listener (TLS context, logins): well under a second here, a Pi 10-50x slower, and a
# loaded machine slower still; a broker that is not up by then says so.
START_TIMEOUT_S = 60.0


async def _shut_down(broker: Any, port: int) -> None:
    """amqtt's shutdown, bounded. Note: amqtt 0.12 can hang in it for good: a client packet that arrives
    as a reader task is cancelled makes 3.11's ``asyncio.wait_for`` swallow the cancellation, and the
    reader then waits on its socket for ever (and so do ``wait_for`` and ``asyncio.run``'s clean-up).
    So the shutdown gets :data:`SHUTDOWN_GRACE_S`; then the listeners and every client connection are
    closed under it, which ends any such reader."""
    shutdown = asyncio.ensure_future(broker.shutdown())
    _, pending = await asyncio.wait({shutdown}, timeout=SHUTDOWN_GRACE_S)
    if pending:
        log.warning(
            "amqtt did not shut down within %.0f s (port %d); closing its connections", SHUTDOWN_GRACE_S, port
        )
        shutdown.cancel()
        for server in broker._servers.values():
            if server.instance is not None:
                server.instance.close()
    for writer in list(broker.connections):
        writer.transport.abort()  # the socket closes now; its reader ends with "connection lost"


def _run_bounded(main: Coroutine[Any, Any, None], grace: float = 2.0) -> None:
    """``asyncio.run(main)``, except that the clean-up waits at most ``grace`` seconds for the tasks
    left behind (``asyncio.run`` waits for ever for one that swallowed its cancellation)."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                _, stuck = loop.run_until_complete(asyncio.wait(left, timeout=grace))
                if stuck:
                    log.debug("%d broker task(s) ignored their cancellation; dropped", len(stuck))
            loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), grace))
        except (asyncio.TimeoutError, RuntimeError):
            log.debug("embedded broker: clean-up cut short", exc_info=True)
        finally:
            loop.close()


class _SnapshotDict(dict):
    """A dict whose iteration walks a snapshot.

    Note: amqtt 0.12 iterates its broker-wide subscription table with ``await`` inside the loop (on
    every client connect and every broadcast). A SUBSCRIBE or UNSUBSCRIBE handled meanwhile changes
    the dict and raises ``RuntimeError: dictionary changed size during iteration``, which drops the
    connecting client or kills the broadcast. Re-partitions subscribe and unsubscribe a lot, so the
    embedded broker walks a copy instead.
    """

    def __iter__(self) -> Any:
        return iter(list(super().keys()))

    def items(self) -> Any:
        return list(super().items())


class BrokerAddress:
    """Where a broker of ours listens and how: ``host``, ``port`` (a free one if 0), the credentials
    directory, TLS; its ``url``. Shared by the broker on a thread and the one in a process of its own."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        credentials: str | None = None,
        tls: BrokerTls | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.credentials = credentials
        self.tls = tls

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


class EmbeddedBroker(BrokerAddress):
    """amqtt on a daemon thread with its own event loop.

    ``start()`` returns once the listener accepts connections; ``stop()`` shuts it down. A stopped
    broker can be started again on the same port (used by the broker-restart tests).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        credentials: str | None = None,
        tls: BrokerTls | None = None,
        insecure_plaintext: bool = False,
    ) -> None:
        super().__init__(host, port, credentials=credentials, tls=tls)
        self.insecure_plaintext = insecure_plaintext  # plain TCP beyond loopback (broker_config)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    def start(self, timeout: float = START_TIMEOUT_S) -> EmbeddedBroker:
        config = broker_config(
            self.host,
            self.port,
            credentials=self.credentials,
            tls=self.tls,
            insecure_plaintext=self.insecure_plaintext,
        )
        started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(config, started), name="amqtt", daemon=True)
        self._thread.start()
        started.result(timeout)
        log.info("embedded broker listening on %s", self.url)
        return self

    def _run(self, config: dict[str, Any], started: Future[None]) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            broker = _make_broker(config, self.tls)
            broker._subscriptions = _SnapshotDict()
            await broker.start()
            started.set_result(None)
            await self._stop.wait()
            await _shut_down(broker, self.port)

        try:
            _run_bounded(main())
        except BaseException as exc:  # report any start-up failure to start() instead of a time-out
            if not started.done():
                started.set_exception(exc)
            else:
                log.exception("embedded broker stopped with an error")

    def stop(self, timeout: float = 2 * SHUTDOWN_GRACE_S) -> None:
        """Shut the broker down: its listener closes, its clients are disconnected. Bounded (see
        :func:`_shut_down`); a thread that still does not end is left behind with a warning (a daemon: it
        ends with the process) rather than failing whatever is being torn down around it."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        thread, self._thread, self._loop = self._thread, None, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning(
                    "the embedded broker on port %d did not stop within %.0f s; its thread is left behind "
                    "and ends with this process",
                    self.port,
                    timeout,
                )

    def alive(self, timeout: float = 2.0) -> bool:
        """Whether the broker's event loop runs and answers within ``timeout`` seconds (systemd's
        watchdog asks this: a loop stuck in a callback stops the pets, and systemd restarts the broker)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return False
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # the loop is closed
            return False
        return answered.wait(timeout)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(
    host: str,
    port: int,
    *,
    credentials: str | None = None,
    tls: BrokerTls | None = None,
    insecure_plaintext: bool = False,
) -> None:
    """Run the broker in the foreground until interrupted (``edgeagent broker``). Under systemd
    (``Type=notify``): READY=1 once the listener accepts connections, the watchdog petted while the event
    loop answers, STOPPING=1 on the way out."""
    broker = EmbeddedBroker(
        host, port, credentials=credentials, tls=tls, insecure_plaintext=insecure_plaintext
    ).start()
    notifier = Notifier()
    notifier.ready(f"listening on {broker.url}")
    interval = watchdog_interval()
    dog = Watchdog(notifier, broker.alive, interval).start() if interval else None
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        notifier.send("STOPPING=1")
        if dog is not None:
            dog.stop()
        broker.stop()
