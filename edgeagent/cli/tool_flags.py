"""The options of the commands that train nothing (``broker``, ``credentials``, ``certs``, ``monitor``,
``profile``), grouped with their defaults shown as the training commands' are (:mod:`.flags`).

Names follow the training commands: a file is ``--<what>-file`` (``--cert-file``, ``--key-file``,
``--ca-file``, ``--password-file``), a directory ``--<what>-dir`` (``--credentials-dir`` for the broker's
logins, ``--certs-dir`` for the site's TLS certificates, ``--profiles-dir`` for device profiles). The
earlier spellings (``broker --tls-cert/--tls-key/--tls-ca/--credentials``, ``credentials --dir``, ``profile
--dir``) still work as deprecated aliases that warn once (:class:`edgeagent.cli.flags.Command`). These
options are not configuration keys: no model, no ``EDGEAGENT_*`` variable.
"""

from __future__ import annotations

import click

from edgeagent.cli.flags import Flag, Group
from edgeagent.ops.shipped import CONFIGS

_FILE = click.Path(exists=True, dir_okay=False)
DEFAULT_BROKER = "mqtt://127.0.0.1:1883"
CREDENTIALS_DIR = "/etc/edgeagent/broker"
CERTS_DIR = "/etc/edgeagent/tls"
PROFILES_DIR = "/etc/edgeagent/devices"


def _tool(
    decls: tuple[str, ...],
    key: str,
    text: str,
    default: object = None,
    *,
    aliases: tuple[str, ...] = (),
    **kwargs: object,
) -> Flag:
    """An option of a tool: ``default`` is its value and is shown (None: no default)."""
    shown = None if default is None else ("off" if default is False else str(default))
    return Flag(decls, key, text, None, default=shown, aliases=aliases, kwargs={"default": default, **kwargs})


# -- edgeagent broker ------------------------------------------------------------------------------------

BROKER_LISTENER = Group(
    "Listener",
    (
        _tool(("--host",), "host", "Address to listen on.", "127.0.0.1"),
        Flag(
            ("--port",),
            "port",
            "Port.",
            None,
            default="1883, or 8883 with --cert-file",
            kwargs={"type": click.IntRange(1, 65535)},
        ),
        _tool(("--log-level",), "log_level", "Logging level.", "INFO"),
    ),
)

BROKER_SECURITY = Group(
    "Logins and TLS",
    (
        Flag(
            ("--credentials-dir",),
            "credentials_dir",
            "Directory made by `edgeagent credentials add`: logins and topic rights. Required beyond "
            "loopback (with --cert-file and --key-file).",
            None,
            aliases=("--credentials",),
            kwargs={"type": click.Path(exists=True, file_okay=False)},
        ),
        Flag(
            ("--cert-file",),
            "cert_file",
            "Serve mqtts:// with this certificate.",
            None,
            aliases=("--tls-cert",),
            kwargs={"type": _FILE},
        ),
        Flag(
            ("--key-file",),
            "key_file",
            "The key of --cert-file.",
            None,
            aliases=("--tls-key",),
            kwargs={"type": _FILE},
        ),
        Flag(
            ("--ca-file",),
            "ca_file",
            "Verify client certificates against this CA.",
            None,
            aliases=("--tls-ca",),
            kwargs={"type": _FILE},
        ),
        _tool(
            ("--require-client-cert",),
            "require_client_cert",
            "Refuse TLS clients without a certificate.",
            False,
            is_flag=True,
        ),
        _tool(
            ("--insecure-plaintext",),
            "insecure_plaintext",
            "Listen beyond loopback in plain TCP, without TLS (passwords and data in clear; logged). "
            "Without it a --host beyond loopback needs --cert-file and --key-file.",
            False,
            is_flag=True,
        ),
    ),
)

# -- edgeagent credentials / certs -----------------------------------------------------------------------

CREDENTIALS_DIR_FLAG = _tool(
    ("--credentials-dir",),
    "directory",
    "The credentials directory (give it to `edgeagent broker --credentials-dir`).",
    CREDENTIALS_DIR,
    aliases=("--dir",),
    type=click.Path(file_okay=False),
)

# -- edgeagent monitor / profile -------------------------------------------------------------------------

ACCESS = Group(
    "Broker login and TLS",
    (
        Flag(
            ("--username",), "username", "Broker login.", None, default="the device id, with --password-file"
        ),
        Flag(
            ("--password-file",),
            "password_file",
            "File holding the broker password (relative names are also looked up in "
            "$CREDENTIALS_DIRECTORY for systemd's LoadCredential=).",
            None,
        ),
        Flag(("--ca-file",), "ca_file", "CA of the broker's certificate (mqtts://).", None),
        Flag(("--cert-file",), "cert_file", "Client certificate (mutual TLS).", None),
        Flag(("--key-file",), "key_file", "Key of --cert-file.", None),
        Flag(
            ("--insecure-plaintext",),
            "insecure_plaintext",
            "Send the password over plain mqtt:// to a broker beyond loopback anyway (refused without it; "
            "use mqtts:// with --ca-file).",
            None,
            default="off",
            kwargs={"is_flag": True},
        ),
    ),
)


def broker_group(cluster: str | None, cluster_help: str) -> Group:
    return Group(
        "Broker",
        (
            _tool(("--broker",), "broker", "mqtt://host:port or mqtts://...", DEFAULT_BROKER),
            _tool(("--cluster",), "cluster", cluster_help, cluster),
        ),
    )


MONITOR_DISPLAY = Group(
    "Display",
    (
        _tool(("--refresh",), "refresh", "Seconds between redraws.", 0.5, type=float),
        Flag(
            ("--duration",),
            "duration",
            "Stop after this many seconds.",
            None,
            default="until Ctrl-C",
            kwargs={"type": float},
        ),
        _tool(
            ("--show-left",),
            "show_left",
            "Keep listing devices that left (shut down cleanly); by default they are hidden 30 s after "
            "leaving, at once if they had left before the monitor started.",
            False,
            is_flag=True,
        ),
        _tool(
            ("--connect-timeout",),
            "connect_timeout",
            "Seconds to wait for the broker before giving up (longer over a slow or flaky link).",
            10.0,
            type=click.FloatRange(min=0.1),
        ),
    ),
)

PROFILES = Group(
    "Profiles",
    (
        _tool(
            ("--profiles-dir",),
            "directory",
            "The <id>.yaml profiles (docs/deployment.md installs them here; examples: "
            f"{CONFIGS / 'devices'}).",
            PROFILES_DIR,
            aliases=("--dir",),
            type=click.Path(file_okay=False),
        ),
    ),
)

__all__ = [
    "ACCESS",
    "BROKER_LISTENER",
    "BROKER_SECURITY",
    "CERTS_DIR",
    "CREDENTIALS_DIR",
    "CREDENTIALS_DIR_FLAG",
    "MONITOR_DISPLAY",
    "PROFILES",
    "PROFILES_DIR",
    "broker_group",
]
