"""A role's way into the broker: URL, login and TLS files resolved into transport arguments."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Protocol

from edgeagent.errors import ConfigError
from edgeagent.transport.mqtt import BrokerUrl, TlsOptions


class Access(Protocol):
    """What :class:`edgeagent.config.BrokerAccess` provides (kept structural: no config import here)."""

    @property
    def broker(self) -> str: ...
    @property
    def username(self) -> str | None: ...
    @property
    def password_file(self) -> str | None: ...
    @property
    def ca_file(self) -> str | None: ...
    @property
    def cert_file(self) -> str | None: ...
    @property
    def key_file(self) -> str | None: ...
    @property
    def insecure_plaintext(self) -> bool: ...


def read_password(path: str) -> str:
    """The first line of ``path``; a relative name is also looked up in ``$CREDENTIALS_DIRECTORY``."""
    candidates = [Path(path)]
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if creds and not Path(path).is_absolute():
        candidates.insert(0, Path(creds) / path)
    for candidate in candidates:
        if candidate.is_file():
            try:
                lines = candidate.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"password file {candidate}: cannot read it ({exc})") from None
            if not lines or not lines[0].strip():
                raise ConfigError(f"password file {candidate} is empty; put the password on its first line")
            return lines[0].strip()
    where = f" (nor in $CREDENTIALS_DIRECTORY={creds})" if creds else ""
    raise ConfigError(f"password file {path} does not exist{where}; see `edgeagent credentials add`")


def resolve(access: Access, device_id: str) -> tuple[BrokerUrl, TlsOptions | None]:
    """The URL with the login filled in, and the TLS options (None: plain, or the system CAs)."""
    url = BrokerUrl.parse(access.broker)
    if access.password_file:
        url = dataclasses.replace(
            url,
            username=access.username or url.username or device_id,
            password=read_password(access.password_file),
        )
    elif access.username:
        url = dataclasses.replace(url, username=access.username)
    files = (access.ca_file, access.cert_file, access.key_file)
    for f in files:
        if f and not Path(f).is_file():
            raise ConfigError(f"TLS file {f} does not exist")
    if (access.cert_file is None) != (access.key_file is None):
        raise ConfigError("cert_file and key_file go together (a client certificate needs its key)")
    if any(files) and not url.tls:
        raise ConfigError(f"TLS files given but the broker URL {url.redacted()} is not mqtts://")
    tls = TlsOptions(*files) if any(files) else None
    return url, tls
