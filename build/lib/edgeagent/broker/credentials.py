"""Broker logins: one directory holds every user's role and password hashes, for amqtt and Mosquitto.

::

    <dir>/users.yaml         name -> role, cluster and Home Assistant discovery prefix (no secrets);
                             the source of the ACLs
    <dir>/passwd             name:argon2 hash       (the embedded broker; amqtt's FileAuthPlugin format)
    <dir>/mosquitto.passwd   name:$7$ PBKDF2-SHA512  (Mosquitto's password_file)
    <dir>/mosquitto.acl      Mosquitto's acl_file, generated from users.yaml

``edgeagent credentials add|remove|list`` edits it; every change rewrites all four files, and the
embedded broker reloads them without a restart. Passwords are random, shown once, never stored in
clear (``--password-out`` writes each to a 0600 file for copying to its device).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from edgeagent.errors import ConfigError, ProtocolError
from edgeagent.ops.homeassistant import DEFAULT_PREFIX, check_prefix
from edgeagent.protocol.acl import ROLES, Grant, mosquitto_acl
from edgeagent.protocol.topics import check_name

USERS = "users.yaml"
PASSWD = "passwd"
MOSQUITTO_PASSWD = "mosquitto.passwd"
MOSQUITTO_ACL = "mosquitto.acl"
_MOSQUITTO_ITERATIONS = 101  # mosquitto_passwd's default for $7$


def _hasher() -> Any:
    from pwdlib import PasswordHash
    from pwdlib.hashers.argon2 import Argon2Hasher

    return PasswordHash((Argon2Hasher(),))


def verify_password(password: str, hashed: str) -> bool:
    """Whether ``password`` matches an argon2 ``hashed`` (an unknown or corrupt hash: no, not a crash)."""
    try:
        return bool(_hasher().verify(password, hashed))
    except Exception:
        return False


def mosquitto_hash(
    password: str, *, salt: bytes | None = None, iterations: int = _MOSQUITTO_ITERATIONS
) -> str:
    """Mosquitto 2's ``$7$`` format: PBKDF2-HMAC-SHA512 with a 12-byte salt."""
    salt = salt if salt is not None else secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_mosquitto_hash(password: str, encoded: str) -> bool:
    try:
        _, kind, iterations, salt, _digest = encoded.split("$")
        if kind != "7":
            return False
        expected = mosquitto_hash(password, salt=base64.b64decode(salt), iterations=int(iterations))
    except ValueError:
        return False
    return hmac.compare_digest(expected, encoded)


@dataclass(frozen=True)
class User:
    name: str
    grant: Grant
    argon2: str
    mosquitto: str


def _write(path: Path, text: str, mode: int = 0o640) -> None:
    """Atomically, so a broker reloading never reads half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class CredentialStore:
    """The credentials directory (created on the first ``add``)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    # -- reading -------------------------------------------------------------------------------

    def users(self) -> dict[str, User]:
        path = self.directory / USERS
        if not path.exists():
            return {}
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({exc})") from None
        hashes = self._hashes(self.directory / PASSWD)
        mosquitto = self._hashes(self.directory / MOSQUITTO_PASSWD)
        users: dict[str, User] = {}
        for name, entry in (raw.get("users") or {}).items():
            if not isinstance(entry, dict) or entry.get("role") not in ROLES:
                raise ConfigError(f"{path}: user {name!r} needs role: one of {', '.join(ROLES)}")
            prefix = str(entry.get("home_assistant_prefix", DEFAULT_PREFIX))
            try:
                check_prefix(prefix)
            except ValueError as exc:
                raise ConfigError(f"{path}: user {name!r}: {exc}") from None
            grant = Grant(
                role=entry["role"], cluster=str(entry.get("cluster", "default")), home_assistant_prefix=prefix
            )
            if name not in hashes:
                raise ConfigError(f"{path}: user {name!r} has no password in {PASSWD}; add it again")
            users[name] = User(name, grant, hashes[name], mosquitto.get(name, ""))
        return users

    @staticmethod
    def _hashes(path: Path) -> dict[str, str]:
        if not path.exists():
            return {}
        out = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.startswith("#") and ":" in line:
                name, _, hashed = line.partition(":")
                out[name] = hashed
        return out

    def grants(self) -> dict[str, Grant]:
        return {name: u.grant for name, u in self.users().items()}

    def verify(self, name: str, password: str) -> bool:
        user = self.users().get(name)
        return user is not None and verify_password(password, user.argon2)

    # -- changing ------------------------------------------------------------------------------

    def add(
        self,
        name: str,
        *,
        role: str = "device",
        cluster: str = "default",
        password: str | None = None,
        home_assistant_prefix: str = DEFAULT_PREFIX,
    ) -> str:
        """Add (or re-key) a login; returns its password (random unless given).

        ``home_assistant_prefix`` is where a central login may publish its cluster's discovery configs
        and an observer (Home Assistant) may read them: the ``discovery_prefix`` of Home Assistant's
        MQTT integration and ``home_assistant_prefix`` of the central node's configuration.
        """
        try:
            check_name("user name", name)
            if cluster != "*":
                check_name("cluster", cluster)
            check_prefix(home_assistant_prefix)
        except (ProtocolError, ValueError) as exc:
            raise ConfigError(str(exc)) from None
        if role not in ROLES:
            raise ConfigError(f"role {role!r}: use one of {', '.join(ROLES)}")
        if password is not None and len(password) < 12:
            raise ConfigError(f"the password of {name!r} has {len(password)} characters; use at least 12")
        password = password if password is not None else secrets.token_urlsafe(18)
        users = self.users()
        users[name] = User(
            name,
            Grant(role=role, cluster=cluster, home_assistant_prefix=home_assistant_prefix),
            _hasher().hash(password),
            mosquitto_hash(password),
        )
        self._save(users)
        return password

    def remove(self, name: str) -> None:
        users = self.users()
        if name not in users:
            known = ", ".join(sorted(users)) or "none"
            raise ConfigError(f"no user {name!r} in {self.directory} (users: {known})")
        del users[name]
        self._save(users)

    def _save(self, users: dict[str, User]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        entries: dict[str, dict[str, str]] = {}
        for n, u in sorted(users.items()):
            entries[n] = {"role": u.grant.role, "cluster": u.grant.cluster}
            if u.grant.home_assistant_prefix != DEFAULT_PREFIX:  # users.yaml stays as before for most
                entries[n]["home_assistant_prefix"] = u.grant.home_assistant_prefix
        header = "# Written by `edgeagent credentials`. Roles: central, device, observer.\n"
        _write(self.directory / USERS, header + yaml.safe_dump({"users": entries}, sort_keys=True), 0o644)
        _write(self.directory / PASSWD, "".join(f"{n}:{u.argon2}\n" for n, u in sorted(users.items())))
        _write(
            self.directory / MOSQUITTO_PASSWD,
            "".join(f"{n}:{u.mosquitto}\n" for n, u in sorted(users.items()) if u.mosquitto),
        )
        _write(self.directory / MOSQUITTO_ACL, mosquitto_acl({n: u.grant for n, u in users.items()}), 0o644)
