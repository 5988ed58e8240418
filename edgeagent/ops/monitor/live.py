"""``edgeagent monitor``'s live loop: subscribe, fold every payload into a :class:`~.state.ClusterState`
on paho's network thread (under a lock) and redraw it with :class:`rich.live.Live` until Ctrl-C.

The monitor subscribes only to the topics it shows (:func:`~.state.subscriptions`), not to
``edgeagent/v1/+/#``: activations, gradients and replicas are most of a run's traffic, and a dashboard
should not double what the broker sends on a slow link.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import TYPE_CHECKING

from rich.console import Console, RenderableType
from rich.live import Live

from edgeagent.errors import EdgeAgentError
from edgeagent.ops.monitor.state import ClusterState, subscriptions
from edgeagent.ops.monitor.view import render

if TYPE_CHECKING:
    from edgeagent.transport.mqtt import BrokerUrl, TlsOptions

CONNECT_TIMEOUT = 10.0


def run_monitor(
    *,
    broker: str | BrokerUrl,
    cluster: str | None = None,
    refresh: float = 0.5,
    duration: float | None = None,
    console: Console | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    tls: TlsOptions | None = None,
    show_left: bool = False,
    insecure_plaintext: bool = False,
) -> None:
    """Show the cluster(s) on ``broker`` until Ctrl-C (or for ``duration`` seconds).

    Raises :class:`~edgeagent.errors.EdgeAgentError` when the broker cannot be reached within
    ``connect_timeout``, :class:`~edgeagent.errors.ConfigError` for a malformed broker URL and
    :class:`~edgeagent.errors.ProtocolError` for an invalid cluster name.
    """
    from edgeagent.ops.logs import console as default_console
    from edgeagent.transport.mqtt import BrokerUrl, MqttTransport

    if not refresh > 0:
        raise ValueError(f"refresh must be > 0 seconds, got {refresh}")
    patterns = subscriptions(cluster)  # checks the cluster name
    url = broker if isinstance(broker, BrokerUrl) else BrokerUrl.parse(broker)
    out = console or default_console
    state = ClusterState(
        cluster=cluster,
        title=f"edgeagent monitor  ·  {url.redacted()}  ·  cluster {cluster or 'all'}",
        show_left=show_left,
    )
    lock = threading.Lock()

    def on_payload(topic: str, payload: bytes) -> None:
        with lock:
            state.apply(topic, payload)

    def screen() -> RenderableType:
        with lock:
            return render(state)

    client_id = f"ea-monitor-{secrets.token_hex(4)}"
    transport = MqttTransport(url, client_id, tls=tls, insecure_plaintext=insecure_plaintext)
    try:
        for pattern in patterns:
            transport.subscribe(pattern, on_payload)
        with out.status(f"connecting to {url.redacted()}…"):
            connected = transport.wait_connected(connect_timeout)
        if not connected:
            raise EdgeAgentError(
                f"cannot reach the MQTT broker at {url.redacted()} within {connect_timeout:g} s. "
                "Is it running (`edgeagent broker` starts one), and is --broker right?"
            )
        deadline = None if duration is None else time.monotonic() + duration
        with Live(get_renderable=screen, console=out, refresh_per_second=1 / refresh):
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass
    finally:
        transport.close()
