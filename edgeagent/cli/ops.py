"""The operator's commands: ``edgeagent monitor`` (the live dashboard) and ``profile`` (device profiles)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click
import cloup

from edgeagent.cli.flags import SETTINGS, apply
from edgeagent.cli.options import F, resolve_access
from edgeagent.cli.tool_flags import ACCESS, MONITOR_DISPLAY, PROFILES, broker_group
from edgeagent.errors import ConfigError, EdgeAgentError
from edgeagent.ops.logs import console, setup_logging

__all__ = ["monitor", "profile"]


@cloup.command(**SETTINGS)
@apply([broker_group(None, "Show one cluster (default: all)."), ACCESS, MONITOR_DISPLAY])
def monitor(
    broker: str,
    cluster: str | None,
    refresh: float,
    duration: float | None,
    show_left: bool,
    connect_timeout: float,
    **kw: Any,
) -> None:
    """A live dashboard of the cluster: devices, stages, throughput, heartbeats and events."""
    from edgeagent.ops.monitor import run_monitor

    setup_logging("WARNING")
    url, tls = resolve_access(broker, kw, "monitor")
    run_monitor(
        insecure_plaintext=bool(kw.get("insecure_plaintext")),
        broker=url,
        cluster=cluster,
        refresh=refresh,
        duration=duration,
        tls=tls,
        show_left=show_left,
        connect_timeout=connect_timeout,
    )


@cloup.group()
def profile() -> None:
    """Device profiles (/etc/edgeagent/devices/<id>.yaml), pushed from the central node as retained
    messages."""


def _profile_transport(broker: str, cluster: str, kw: dict[str, Any]) -> tuple[Any, Any]:
    from edgeagent.protocol.topics import Topics
    from edgeagent.transport.mqtt import MqttTransport

    url, tls = resolve_access(broker, kw, "central")
    plain = bool(kw.get("insecure_plaintext"))
    transport = MqttTransport(url, f"ea-profile-{os.getpid()}", tls=tls, insecure_plaintext=plain)
    if not transport.wait_connected(10):
        transport.close()
        raise EdgeAgentError(
            f"no broker at {url.redacted()} within 10 s; is it running, and is --broker right?"
        )
    return transport, Topics(cluster)


_profile_groups = apply([broker_group("default", "The cluster."), PROFILES, ACCESS])


def profile_options(f: F) -> F:
    return _profile_groups(f)


@profile.command("push", **SETTINGS)
@profile_options
@click.argument("ids", nargs=-1)
def profile_push(broker: str, cluster: str, directory: str, ids: tuple[str, ...], **kw: Any) -> None:
    """Validate the profiles (all of DIR, or the IDS) and push them to their devices."""
    from edgeagent.ops import profiles as profiles_module

    if not Path(directory).is_dir():
        raise ConfigError(
            f"--profiles-dir {directory}: no such directory; give the directory of <id>.yaml profiles"
        )
    found = profiles_module.load_profiles(directory, list(ids) or None)
    if not found:
        raise ConfigError(f"no profiles (<id>.yaml) in {directory}; nothing to push")
    transport, topics = _profile_transport(broker, cluster, kw)
    try:
        profiles_module.push(transport, topics, found)
    finally:
        transport.close()
    for p in found:
        console.print(f"pushed {p.id} (profile {p.digest()})")


@profile.command("show", **SETTINGS)
@profile_options
@click.argument("device_id")
def profile_show(broker: str, cluster: str, directory: str, device_id: str, **kw: Any) -> None:
    """Print the profile the broker holds for DEVICE_ID."""
    from edgeagent.ops import profiles as profiles_module

    transport, topics = _profile_transport(broker, cluster, kw)
    try:
        current = profiles_module.fetch(transport, topics, device_id)
    finally:
        transport.close()
    if current is None:
        console.print(f"no profile pushed for {device_id} on cluster {cluster}")
        sys.exit(1)
    console.print(f"# profile {current.digest()}\n{profiles_module.dump(current)}", highlight=False)


@profile.command("diff", **SETTINGS)
@profile_options
@click.argument("device_id")
def profile_diff(broker: str, cluster: str, directory: str, device_id: str, **kw: Any) -> None:
    """Compare DIR/DEVICE_ID.yaml with the profile the broker holds."""
    import difflib

    from edgeagent.ops import profiles as profiles_module

    local = profiles_module.load_profile(Path(directory) / f"{device_id}.yaml")
    transport, topics = _profile_transport(broker, cluster, kw)
    try:
        current = profiles_module.fetch(transport, topics, device_id)
    finally:
        transport.close()
    pushed = profiles_module.dump(current).splitlines() if current else []
    lines = list(
        difflib.unified_diff(pushed, profiles_module.dump(local).splitlines(), "pushed", "local", lineterm="")
    )
    console.print("\n".join(lines) if lines else "no difference", highlight=False)
