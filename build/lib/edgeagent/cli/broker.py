"""The broker commands: ``edgeagent broker`` (the embedded broker), ``credentials`` (logins and topic
rights) and ``certs`` (the site's TLS certificates, from :mod:`edgeagent.broker.certs`)."""

from __future__ import annotations

from pathlib import Path

import click

from edgeagent.broker.certs import certs_command
from edgeagent.errors import ConfigError
from edgeagent.ops.logs import console, setup_logging

__all__ = ["broker", "certs_command", "credentials"]


_FILE = click.Path(exists=True, dir_okay=False)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), help="Port [default: 1883, or 8883 with --tls-cert].")
@click.option(
    "--credentials",
    type=click.Path(exists=True, file_okay=False),
    help="Directory made by `edgeagent credentials add`: logins and topic rights. Required beyond loopback "
    "(with --tls-cert and --tls-key).",
)
@click.option("--tls-cert", type=_FILE, help="Serve mqtts:// with this certificate.")
@click.option("--tls-key", type=_FILE, help="The key of --tls-cert.")
@click.option("--tls-ca", type=_FILE, help="Verify client certificates against this CA.")
@click.option("--require-client-cert", is_flag=True, help="Refuse TLS clients without a certificate.")
@click.option(
    "--insecure-plaintext",
    is_flag=True,
    help="Listen beyond loopback in plain TCP, without TLS (passwords and data in clear; logged). "
    "Without it a --host beyond loopback needs --tls-cert and --tls-key.",
)
@click.option("--log-level", default="INFO")
def broker(
    host: str,
    port: int | None,
    credentials: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
    require_client_cert: bool,
    insecure_plaintext: bool,
    log_level: str,
) -> None:
    """The embedded MQTT 3.1.1 broker (amqtt)."""
    from amqtt.errors import BrokerError

    from edgeagent.broker import BrokerTls, serve_forever

    setup_logging(log_level, device="broker")
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if tls_cert is None and (tls_ca or require_client_cert):
        raise ConfigError("--tls-ca and --require-client-cert need --tls-cert and --tls-key")
    if require_client_cert and not tls_ca:
        raise ConfigError("--require-client-cert needs --tls-ca to verify the client certificates")
    tls = (
        BrokerTls(tls_cert, tls_key, tls_ca, require_client_cert)
        if tls_cert is not None and tls_key is not None
        else None
    )
    port = port or (8883 if tls else 1883)
    try:
        serve_forever(host, port, credentials=credentials, tls=tls, insecure_plaintext=insecure_plaintext)
    except BrokerError as exc:  # amqtt's wrapper of the listener's OSError (port taken, bad address)
        cause = exc.__cause__ or exc
        raise ConfigError(
            f"cannot listen on {host}:{port} ({cause}); is another broker running there? "
            "Stop it or pick another --port / --host"
        ) from exc


@click.group()
def credentials() -> None:
    """Broker logins and topic rights (per-device passwords; ACLs for amqtt and Mosquitto)."""


_credentials_dir = click.option(
    "--dir",
    "directory",
    default="/etc/edgeagent/broker",
    show_default=True,
    type=click.Path(file_okay=False),
    help="The credentials directory (give it to `edgeagent broker --credentials`).",
)


@credentials.command("add")
@_credentials_dir
@click.argument("names", nargs=-1)
@click.option(
    "--role",
    type=click.Choice(["device", "central", "observer"]),
    default="device",
    show_default=True,
    help="device: own topics and stage outputs; central: the whole cluster; observer: read only.",
)
@click.option("--cluster", default="default", show_default=True, help="The cluster (* for all).")
@click.option(
    "--profiles",
    type=click.Path(exists=True, file_okay=False),
    help="Also add a device login for every profile in this directory (e.g. /etc/edgeagent/devices).",
)
@click.option(
    "--password-out",
    type=click.Path(file_okay=False),
    help="Write each new password to DIR/<name>.password (mode 0600) instead of printing it.",
)
@click.option(
    "--home-assistant-prefix",
    default="homeassistant",
    show_default=True,
    help="Home Assistant's MQTT discovery prefix: a central login may publish its cluster's discovery "
    "configs under it (`edgeagent central --home-assistant`), an observer (Home Assistant) reads it.",
)
def credentials_add(
    directory: str,
    names: tuple[str, ...],
    role: str,
    cluster: str,
    profiles: str | None,
    password_out: str | None,
    home_assistant_prefix: str,
) -> None:
    """Add logins NAMES (or re-key existing ones) with random passwords."""
    from edgeagent.broker.credentials import CredentialStore
    from edgeagent.ops.profiles import load_profiles

    store = CredentialStore(directory)
    wanted = [(n, role) for n in names]
    if profiles:
        known = store.users()
        wanted += [(p.id, "device") for p in load_profiles(profiles, None) if p.id not in known]
    if not wanted:
        raise ConfigError("nothing to add: give NAMES or --profiles DIR")
    for name, name_role in wanted:
        password = store.add(
            name, role=name_role, cluster=cluster, home_assistant_prefix=home_assistant_prefix
        )
        if password_out:
            out = Path(password_out)
            out.mkdir(parents=True, exist_ok=True)
            target = out / f"{name}.password"
            target.touch(mode=0o600, exist_ok=True)
            target.chmod(0o600)
            target.write_text(password + "\n", encoding="utf-8")
            console.print(f"added {name} ({name_role}, cluster {cluster}); password in {target}")
        else:
            console.print(f"added {name} ({name_role}, cluster {cluster}); password: {password}")
    console.print(
        f"the embedded broker ({directory}) picks this up at the next login; Mosquitto needs "
        "`kill -HUP` (password_file mosquitto.passwd, acl_file mosquitto.acl)",
        highlight=False,
    )


@credentials.command("remove")
@_credentials_dir
@click.argument("names", nargs=-1, required=True)
def credentials_remove(directory: str, names: tuple[str, ...]) -> None:
    """Remove logins NAMES (connected clients keep their session until they reconnect)."""
    from edgeagent.broker.credentials import CredentialStore

    store = CredentialStore(directory)
    for name in names:
        store.remove(name)
        console.print(f"removed {name}")


@credentials.command("list")
@_credentials_dir
def credentials_list(directory: str) -> None:
    """List the logins, their roles and clusters (never passwords)."""
    from edgeagent.broker.credentials import CredentialStore
    from edgeagent.ops.homeassistant import DEFAULT_PREFIX

    users = CredentialStore(directory).users()
    if not users:
        console.print(f"no logins in {directory}; add some with `edgeagent credentials add`")
        return
    for name, user in sorted(users.items()):
        grant = user.grant
        prefix = grant.home_assistant_prefix
        extra = f"  home assistant {prefix}" if prefix != DEFAULT_PREFIX and grant.role != "device" else ""
        console.print(f"{name:24} {grant.role:9} cluster {grant.cluster}{extra}", highlight=False)
