"""The embedded MQTT 3.1.1 broker (amqtt), run in-process on a thread or as ``edgeagent broker``.

Any standard MQTT 3.1.1 broker works instead: point every role at it with ``--broker mqtt://host:port``.
Configuration files for the embedded broker and for Mosquitto live in the repository's ``broker/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import threading
from concurrent.futures import Future
from typing import Any

from edgeagent.errors import ConfigError

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port that is free right now (for tests and the demo)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def broker_config(host: str, port: int, *, password_file: str | None = None) -> dict[str, Any]:
    """The amqtt configuration. Anonymous clients are allowed only on a loopback listener."""
    if not is_loopback(host) and password_file is None:
        raise ConfigError(
            f"the broker would listen on {host}:{port}, beyond loopback, without credentials; "
            "give --password-file (see `edgeagent credentials`) or bind to 127.0.0.1"
        )
    plugins: dict[str, Any] = {}
    if password_file is None:
        plugins["amqtt.plugins.authentication.AnonymousAuthPlugin"] = {"allow_anonymous": True}
    else:
        plugins["amqtt.plugins.authentication.FileAuthPlugin"] = {"password_file": password_file}
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}", "max_connections": 256}},
        "plugins": plugins,
    }


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


class EmbeddedBroker:
    """amqtt on a daemon thread with its own event loop.

    ``start()`` returns once the listener accepts connections; ``stop()`` shuts it down. A stopped
    broker can be started again on the same port (used by the broker-restart tests).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, password_file: str | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.password_file = password_file
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        config = broker_config(self.host, self.port, password_file=self.password_file)
        started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(config, started), name="amqtt", daemon=True)
        self._thread.start()
        started.result(timeout)
        log.info("embedded broker listening on %s", self.url)
        return self

    def _run(self, config: dict[str, Any], started: Future[None]) -> None:
        async def main() -> None:
            from amqtt.broker import Broker

            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            broker = Broker(config)
            broker._subscriptions = _SnapshotDict()
            await broker.start()
            started.set_result(None)
            await self._stop.wait()
            try:
                await asyncio.wait_for(broker.shutdown(), 5.0)
            except Exception:
                # amqtt can hang in shutdown when a client packet races the reader's cancellation
                # (asyncio.wait_for on 3.11 swallows it); close the listeners ourselves.
                for server in broker._servers.values():
                    with contextlib.suppress(Exception):
                        await server.close_instance()

        try:
            asyncio.run(main())
        except BaseException as exc:  # report any start-up failure to start() instead of a time-out
            if not started.done():
                started.set_exception(exc)
            else:
                log.exception("embedded broker stopped with an error")

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        thread, self._thread, self._loop = self._thread, None, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise RuntimeError(
                    f"the embedded broker on port {self.port} did not stop within {timeout:.0f} s"
                )

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(host: str, port: int, *, password_file: str | None = None) -> None:
    """Run the broker in the foreground until interrupted (``edgeagent broker``)."""
    broker = EmbeddedBroker(host, port, password_file=password_file).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
