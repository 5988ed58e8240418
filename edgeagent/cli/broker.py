"""The broker commands: ``edgeagent broker`` (the embedded broker), ``credentials`` (logins and topic
rights) and ``certs`` (the site's TLS certificates, from :mod:`edgeagent.broker.certs`)."""

from __future__ import annotations

from pathlib import Path

import click
import cloup

from edgeagent.cli.flags import SETTINGS, Flag, Group, apply, warn_deprecated
from edgeagent.cli.tool_flags import BROKER_LISTENER, BROKER_SECURITY, CREDENTIALS_DIR_FLAG
from edgeagent.errors import ConfigError
from edgeagent.ops.logs import console, setup_logging

__all__ = ["broker", "certs_command", "credentials"]


@cloup.command(**SETTINGS)
@apply([BROKER_LISTENER, BROKER_SECURITY])
def broker(
    host: str,
    port: int | None,
    log_level: str,
    credentials_dir: str | None,
    cert_file: str | None,
    key_file: str | None,
    ca_file: str | None,
    require_client_cert: bool,
    insecure_plaintext: bool,
) -> None:
    """The embedded MQTT 3.1.1 broker (amqtt)."""
    from amqtt.errors import BrokerError

    from edgeagent.broker import BrokerTls, serve_forever

    setup_logging(log_level, device="broker")
    if (cert_file is None) != (key_file is None):
        raise ConfigError("--cert-file and --key-file go together")
    if cert_file is None and (ca_file or require_client_cert):
        raise ConfigError("--ca-file and --require-client-cert need --cert-file and --key-file")
    if require_client_cert and not ca_file:
        raise ConfigError("--require-client-cert needs --ca-file to verify the client certificates")
    tls = (
        BrokerTls(cert_file, key_file, ca_file, bool(require_client_cert))
        if cert_file is not None and key_file is not None
        else None
    )
    port = port or (8883 if tls else 1883)
    try:
        serve_forever(
            host, port, credentials=credentials_dir, tls=tls, insecure_plaintext=bool(insecure_plaintext)
        )
    except BrokerError as exc:  # amqtt's wrapper of the listener's OSError (port taken, bad address)
        cause = exc.__cause__ or exc
        raise ConfigError(
            f"cannot listen on {host}:{port} ({cause}); is another broker running there? "
            "Stop it or pick another --port / --host"
        ) from exc


@cloup.group()
def credentials() -> None:
    """Broker logins and topic rights (per-device passwords; ACLs for amqtt and Mosquitto)."""


_credentials_dir = apply([Group("Where", (CREDENTIALS_DIR_FLAG,))])


@credentials.command("add", **SETTINGS)
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


@credentials.command("remove", **SETTINGS)
@_credentials_dir
@click.argument("names", nargs=-1, required=True)
def credentials_remove(directory: str, names: tuple[str, ...]) -> None:
    """Remove logins NAMES (connected clients keep their session until they reconnect)."""
    from edgeagent.broker.credentials import CredentialStore

    store = CredentialStore(directory)
    for name in names:
        store.remove(name)
        console.print(f"removed {name}")


@credentials.command("list", **SETTINGS)
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


@cloup.command("certs", **SETTINGS)
@click.argument(
    "old_directory", metavar="[DIR]", required=False, type=click.Path(file_okay=False, path_type=Path)
)
@apply(
    [
        Group(
            "Certificates",
            (
                Flag(
                    ("--certs-dir",),
                    "directory",
                    "Where the CA, the broker's and the devices' certificates go (required).",
                    None,
                    kwargs={"type": click.Path(file_okay=False, path_type=Path)},
                ),
                Flag(
                    ("--host",),
                    "hosts",
                    "A DNS name or IP address the broker is reached by (repeat).",
                    None,
                    default="localhost and 127.0.0.1, always in",
                    kwargs={"multiple": True, "metavar": "NAME|IP"},
                ),
                Flag(
                    ("--device",),
                    "devices",
                    "A device id to issue a client certificate for (repeat).",
                    None,
                    kwargs={"multiple": True, "metavar": "ID"},
                ),
            ),
        )
    ]
)
def certs_command(
    old_directory: Path | None, directory: Path | None, hosts: tuple[str, ...], devices: tuple[str, ...]
) -> None:
    """Make (or complete) the site's TLS certificates in --certs-dir: a CA, the broker's and one per device.

    Existing files are never overwritten: run it again with more --device to add devices.
    """
    if old_directory is not None:
        warn_deprecated("certs DIR", "certs --certs-dir DIR")
        directory = directory or old_directory
    if directory is None:
        raise click.UsageError("give the directory of the certificates: --certs-dir DIR")
    from edgeagent.broker.certs import init_site, san_hosts  # cryptography: the [central] or [broker] extra

    try:
        site = init_site(directory, hosts, devices)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    for path in site.written:
        click.echo(f"wrote {path}" + (" (private key, mode 0600)" if path.suffix == ".key" else ""))
    kept = sorted({p.with_suffix("").name for p in site.kept})
    if kept:
        click.echo(f"kept the existing {', '.join(kept)} (nothing is overwritten)")
    if not site.written:
        click.echo("nothing to write: every certificate asked for is there")
    names = ", ".join(san_hosts(site.broker.load_certificate()))
    click.echo(f"the broker certificate is valid for: {names}")
    for note in site.notes:
        click.echo(f"note: {note}")
    d = site.directory
    example = next(iter(site.devices), "DEVICE")
    host = next((h for h in hosts if h not in ("localhost", "127.0.0.1")), "BROKER_HOST")
    click.echo(
        "\nnext steps:\n"
        f"  keep {d / 'ca.key'} on this machine only (it signs new certificates); copy nothing but\n"
        f"  ca.pem and a device's own DEVICE.pem/DEVICE.key to that device.\n"
        "  broker:\n"
        "    edgeagent broker --host 0.0.0.0 --port 8883 --credentials-dir DIR \\\n"
        f"      --cert-file {d / 'broker.pem'} --key-file {d / 'broker.key'} --ca-file {d / 'ca.pem'} "
        "--require-client-cert\n"
        "  each worker (and the central node, with its own device certificate):\n"
        f"    edgeagent worker --broker mqtts://{host}:8883 --ca-file ca.pem --cert-file {example}.pem "
        f"--key-file {example}.key ..."
    )
