"""``edgeagent bundle DEVICE``: the one archive a Pi needs, made on the central node.

It holds what the worker unit reads, laid out as under ``/etc/edgeagent`` (``tar -xzf pi-1.tar.gz -C
/etc/edgeagent``): ``worker.yaml`` (the shipped one with the device's id, cluster and broker URL),
``broker-password`` (its login, mode 0600), ``tls/ca.pem`` and the device's client certificate as
``tls/device.pem`` and ``tls/device.key`` (mode 0600). The login comes from the broker's credentials
(:class:`~edgeagent.broker.credentials.CredentialStore`: added if the device has none), the certificate
from the site's TLS directory (:mod:`edgeagent.broker.certs`: issued if the CA's key is there and the
device has none yet).
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from edgeagent.errors import ConfigError
from edgeagent.ops.install import INSTALLED_ETC
from edgeagent.ops.shipped import CONFIGS


@dataclass(frozen=True)
class Member:
    data: bytes
    mode: int


@dataclass
class Bundle:
    """The archive's files by their path relative to the configuration directory, and what was done to
    make them (a login added, a certificate issued), for the operator."""

    device: str
    members: dict[str, Member] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def worker_yaml(device: str, broker: str, cluster: str, etc: str = INSTALLED_ETC) -> str:
    """The shipped ``worker.yaml`` with this device's ``device_id``, ``broker`` and ``cluster``, its
    comments kept, its ``/etc/edgeagent/`` paths under ``etc``."""
    text = (CONFIGS / "worker.yaml").read_text(encoding="utf-8")
    for key, value in (("device_id", device), ("broker", broker), ("cluster", cluster)):
        text, n = re.subn(rf"^{key}:.*$", f"{key}: {value}", text, count=1, flags=re.MULTILINE)
        if n != 1:
            raise ConfigError(f"{CONFIGS / 'worker.yaml'} has no top-level {key}: line")
    return text.replace(f"{INSTALLED_ETC}/", f"{etc.rstrip('/')}/")


def device_password(
    device: str,
    credentials: Path,
    *,
    cluster: str,
    password_file: Path | None = None,
    rekey: bool = False,
) -> tuple[str, str]:
    """(password, what was done): the password in ``password_file`` (checked against the login), a new
    login for a device that has none, or a new password with ``rekey``."""
    from edgeagent.broker.credentials import CredentialStore

    store = CredentialStore(credentials)
    users = store.users()
    if password_file is not None:
        password = password_file.read_text(encoding="utf-8").strip()
        if device not in users or not store.verify(device, password):
            raise ConfigError(f"{password_file} is not the password of login {device!r} in {credentials}")
        return password, f"the password of {device} from {password_file}"
    if device in users and not rekey:
        raise ConfigError(
            f"{device} has a login in {credentials} already and its password is not stored there (only "
            f"a hash); give it with --password-file (e.g. the --password-out file of `edgeagent credentials "
            f"add`), or --rekey for a new one (the device then needs this bundle)"
        )
    if device in users and users[device].grant.role != "device":
        raise ConfigError(f"{device} is a {users[device].grant.role} login, not a device's")
    done = "a new password for" if device in users else "a new login for"
    return store.add(device, role="device", cluster=cluster), f"{done} {device} in {credentials}"


def device_certificate(device: str, tls: Path) -> tuple[bytes, bytes, bytes, str]:
    """(ca.pem, device.pem, device.key, what was done) from the site's TLS directory; the device's
    certificate is issued if the CA's key is there and the device has none."""
    from edgeagent.broker.certs import KeyPair, _check_stem, issue

    _check_stem(device, "device id")
    ca, pair = KeyPair.at(tls, "ca"), KeyPair.at(tls, device)
    if not ca.cert.is_file():
        raise ConfigError(
            f"no site CA in {tls} ({ca.cert.name} missing): make the site's certificates first with "
            f"`edgeagent certs --certs-dir {tls} --host BROKER_HOST --device central`"
        )
    done = f"the certificate of {device} from {tls}"
    if not pair.exists():
        if not ca.key.is_file():
            raise ConfigError(
                f"{device} has no certificate in {tls} and the CA's key is not there to issue one"
            )
        issue(tls, ca, device, client=True)
        done = f"a new certificate for {device} in {tls}"
    elif not (pair.cert.is_file() and pair.key.is_file()):
        raise ConfigError(f"{pair.cert} or {pair.key} is missing; delete the other to reissue the pair")
    return ca.cert.read_bytes(), pair.cert.read_bytes(), pair.key.read_bytes(), done


def make_bundle(
    device: str,
    *,
    broker: str,
    cluster: str,
    credentials: Path,
    tls: Path,
    etc: str = INSTALLED_ETC,
    password_file: Path | None = None,
    rekey: bool = False,
) -> Bundle:
    ca, cert, key, cert_note = device_certificate(device, tls)
    password, login_note = device_password(
        device, credentials, cluster=cluster, password_file=password_file, rekey=rekey
    )
    bundle = Bundle(device, notes=[login_note, cert_note])
    bundle.members = {
        "worker.yaml": Member(worker_yaml(device, broker, cluster, etc).encode(), 0o644),
        "broker-password": Member((password + "\n").encode(), 0o600),
        "tls/ca.pem": Member(ca, 0o644),
        "tls/device.pem": Member(cert, 0o644),
        "tls/device.key": Member(key, 0o600),
    }
    return bundle


def write_archive(bundle: Bundle, target: Path) -> Path:
    """The bundle as a gzipped tar owned by root (it is unpacked as root), itself mode 0600: it holds a
    password and a private key."""
    now = time.time()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        dirs = sorted({str(Path(n).parent) for n in bundle.members} - {"."})
        for name in dirs:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, now
            tar.addfile(info)
        for name, member in bundle.members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(member.data), member.mode, now
            tar.addfile(info, io.BytesIO(member.data))
    return target


__all__ = [
    "Bundle",
    "Member",
    "device_certificate",
    "device_password",
    "make_bundle",
    "worker_yaml",
    "write_archive",
]
