"""Options and argument parsing shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from edgeagent.config import build

F = TypeVar("F", bound=Callable[..., Any])

ACCESS_KEYS = ("username", "password_file", "ca_file", "cert_file", "key_file", "insecure_plaintext")


def access_options(f: F) -> F:
    """How to log in to the broker (see `edgeagent credentials` and `edgeagent certs`)."""
    options = [
        click.option("--username", help="Broker login (default: the device id, with --password-file)."),
        click.option(
            "--password-file",
            help="File holding the broker password (relative names are also looked up in "
            "$CREDENTIALS_DIRECTORY for systemd's LoadCredential=).",
        ),
        click.option("--ca-file", help="CA of the broker's certificate (mqtts://)."),
        click.option("--cert-file", help="Client certificate (mutual TLS)."),
        click.option("--key-file", help="Key of --cert-file."),
        click.option(
            "--insecure-plaintext",
            is_flag=True,
            default=None,
            help="Send the password over plain mqtt:// to a broker beyond loopback anyway (refused without "
            "it; use mqtts:// with --ca-file).",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def resolve_access(broker: str, kw: dict[str, Any], default_user: str) -> tuple[Any, Any]:
    """(BrokerUrl, TlsOptions) for the tools (monitor, profile), from their flags; give their transport
    ``insecure_plaintext=bool(kw.get("insecure_plaintext"))``."""
    from edgeagent.config import BrokerAccess
    from edgeagent.transport.access import resolve

    given = {k: kw[k] for k in ACCESS_KEYS if kw.get(k)}
    access = build(BrokerAccess, {"broker": broker, **given}, source="<arguments>")
    return resolve(access, default_user)
