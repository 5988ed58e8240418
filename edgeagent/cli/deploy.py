"""The deployment commands: ``edgeagent install-service`` (a shipped unit for this install) and
``bundle`` (the archive a Pi needs). Neither imports torch."""

from __future__ import annotations

import shutil
from pathlib import Path

import click
import cloup

from edgeagent.cli.flags import SETTINGS, Flag, Group, apply
from edgeagent.cli.tool_flags import CERTS_DIR, CREDENTIALS_DIR
from edgeagent.ops.install import INSTALLED_ETC, UnitPaths, this_program, write_unit
from edgeagent.ops.logs import console
from edgeagent.ops.shipped import CONFIGS, ROLES

__all__ = ["bundle", "install_service"]

_DIR = click.Path(file_okay=False, path_type=Path)


@click.command("install-service")
@click.argument("role", type=click.Choice(ROLES))
@click.option(
    "--dest",
    type=_DIR,
    default="/etc/systemd/system",
    show_default=True,
    help="Where to write <name>.service.",
)
@click.option(
    "--etc",
    type=_DIR,
    default=INSTALLED_ETC,
    show_default=True,
    help="The configuration directory: the unit's credentials (broker-password, tls/...) and, without "
    "--config, its <role>.yaml are read from here (`edgeagent bundle` unpacks here).",
)
@click.option(
    "--config",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"The role's configuration file [default: ETC/<role>.yaml; examples in {CONFIGS}].",
)
@click.option(
    "--name",
    default="",
    help="The unit's name, also its state directory under /var/lib [default: edgeagent-<role>]. Two "
    "workers on one machine need two names.",
)
@click.option(
    "--program",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The edgeagent program the unit runs [default: this install's, next to its python].",
)
def install_service(
    role: str, dest: Path, etc: Path, config: Path | None, name: str, program: Path | None
) -> None:
    """Write the systemd unit of ROLE (broker, central, worker) with this install's paths."""
    paths = UnitPaths(program=program or this_program(), etc=etc.absolute(), config=config, name=name)
    target = write_unit(role, paths, dest)
    unit = target.stem
    console.print(f"wrote {target} (runs {paths.program})", highlight=False)
    if role != "broker":
        # A first install gets the shipped example where the unit reads it; an existing file is kept.
        wanted = paths.config or paths.etc / f"{role}.yaml"
        if not wanted.exists():
            wanted.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(CONFIGS / f"{role}.yaml", wanted)
            wanted.chmod(0o644)
            console.print(f"wrote {wanted} (the shipped example: edit it before the start)", highlight=False)
    console.print(
        f"next: systemctl daemon-reload && systemctl enable --now {unit}; journalctl -u {unit} -f",
        highlight=False,
    )


@cloup.command(**SETTINGS)
@click.argument("device")
@click.option(
    "--broker",
    default="mqtts://central.local:8883",
    show_default=True,
    help="The broker URL the device connects to (a name or address its certificate covers).",
)
@click.option("--cluster", default="default", show_default=True)
@apply(
    [
        Group(
            "Site",
            (
                Flag(
                    ("--credentials-dir",),
                    "credentials",
                    "The broker's logins (`edgeagent credentials`): DEVICE's login is added here if it has "
                    "none.",
                    None,
                    default=CREDENTIALS_DIR,
                    aliases=("--credentials",),
                    kwargs={"default": CREDENTIALS_DIR, "type": _DIR},
                ),
                Flag(
                    ("--certs-dir",),
                    "tls",
                    "The site's certificates (`edgeagent certs`): DEVICE's is issued here if it has none.",
                    None,
                    default=CERTS_DIR,
                    aliases=("--tls",),
                    kwargs={"default": CERTS_DIR, "type": _DIR},
                ),
            ),
        )
    ]
)
@click.option(
    "--password-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="DEVICE's password, for a device that has a login already (checked against it).",
)
@click.option("--rekey", is_flag=True, help="Give a device that has a login a new password instead.")
@click.option(
    "--etc",
    default=INSTALLED_ETC,
    show_default=True,
    help="Where the device unpacks the bundle (the paths in its worker.yaml).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The archive [default: DEVICE.tar.gz here].",
)
def bundle(
    device: str,
    broker: str,
    cluster: str,
    credentials: Path,
    tls: Path,
    password_file: Path | None,
    rekey: bool,
    etc: str,
    output: Path | None,
) -> None:
    """The archive a Pi needs, made on the central node: DEVICE's worker.yaml (its id, cluster and broker
    URL), its broker password, the site CA and its client certificate and key."""
    from edgeagent.broker.bundle import make_bundle, write_archive
    from edgeagent.config import WorkerConfig, build
    from edgeagent.transport.mqtt import BrokerUrl

    BrokerUrl.parse(broker)  # a bad URL fails here, not on the Pi
    made = make_bundle(
        device,
        broker=broker,
        cluster=cluster,
        credentials=credentials,
        tls=tls,
        etc=etc,
        password_file=password_file,
        rekey=rekey,
    )
    import yaml

    build(WorkerConfig, yaml.safe_load(made.members["worker.yaml"].data), source=f"{device}'s worker.yaml")
    target = write_archive(made, output or Path(f"{device}.tar.gz"))
    for note in made.notes:
        console.print(note, highlight=False)
    console.print(f"wrote {target} (mode 0600: a password and a private key)", highlight=False)
    console.print(
        f"on {device}: install -d -m 0755 {etc} && tar -xzf {target.name} -C {etc} && "
        f"<venv>/bin/edgeagent install-service worker --etc {etc}",
        highlight=False,
    )
