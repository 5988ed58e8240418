"""Options and argument parsing shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from edgeagent.config import build

F = TypeVar("F", bound=Callable[..., Any])

ACCESS_KEYS = ("username", "password_file", "ca_file", "cert_file", "key_file", "insecure_plaintext")


def resolve_access(broker: str, kw: dict[str, Any], default_user: str) -> tuple[Any, Any]:
    """(BrokerUrl, TlsOptions) for the tools (monitor, profile), from their flags; give their transport
    ``insecure_plaintext=bool(kw.get("insecure_plaintext"))``."""
    from edgeagent.config import BrokerAccess
    from edgeagent.transport.access import resolve

    given = {k: kw[k] for k in ACCESS_KEYS if kw.get(k)}
    access = build(BrokerAccess, {"broker": broker, **given}, source="<arguments>")
    return resolve(access, default_user)
