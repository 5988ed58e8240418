"""A small private PKI for one site: a CA, the broker's server certificate and one client certificate per
device, for ``mqtts://`` with the embedded broker or Mosquitto (``edgeagent certs``).

Keys are EC P-256 (fast to make and to handshake with on a Raspberry Pi), certificates are PEM files, key
files are mode 0600. The CA is valid for 10 years, the broker and device certificates for 2. Nothing is
ever overwritten: run the command again to add devices; delete a pair of files to reissue it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import click
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edgeagent.errors import ConfigError

CA_DAYS = 3650
LEAF_DAYS = 730
# Back-date certificates: a Raspberry Pi has no real-time clock and may boot a little behind until NTP.
BACKDATE = dt.timedelta(hours=1)
DEFAULT_CA_NAME = "edgeagent site CA"
RESERVED_STEMS = ("ca", "broker")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DNS_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


@dataclass(frozen=True)
class KeyPair:
    """A certificate file and its key file."""

    cert: Path
    key: Path

    @classmethod
    def at(cls, directory: str | Path, stem: str) -> KeyPair:
        directory = Path(directory)
        return cls(directory / f"{stem}.pem", directory / f"{stem}.key")

    def exists(self) -> bool:
        return self.cert.exists() or self.key.exists()

    def load_certificate(self) -> x509.Certificate:
        try:
            return x509.load_pem_x509_certificate(self.cert.read_bytes())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the certificate {self.cert}: {exc}") from exc

    def load_key(self) -> ec.EllipticCurvePrivateKey:
        try:
            key = serialization.load_pem_private_key(self.key.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigError(f"cannot read the private key {self.key}: {exc}") from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"{self.key} is not an EC private key")
        return key


def _check_stem(stem: str, what: str) -> None:
    if not _NAME.match(stem):
        raise ConfigError(
            f"{what} {stem!r} cannot name a file: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def parse_host(host: str) -> x509.GeneralName:
    """A subjectAltName entry: an IP address (v4 or v6) or a DNS name (``*.`` wildcards allowed)."""
    host = host.strip()
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    name = host.rstrip(".").lower()
    labels = name.split(".")
    if labels and labels[0] == "*" and len(labels) > 1:
        labels = labels[1:]
    if not name or len(name) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
        raise ConfigError(
            f"--host {host!r} is neither an IP address nor a DNS name (letters, digits and '-' in dot-"
            "separated labels)"
        )
    return x509.DNSName(name)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` with ``mode``; refuse to replace an existing file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError as exc:
        raise ConfigError(f"{path} already exists; not overwriting it") from exc
    except OSError as exc:
        raise ConfigError(f"cannot create {path}: {exc}") from exc
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)  # whatever the umask
        f.write(data)


def _write_pair(pair: KeyPair, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    if pair.exists():
        present = [str(p) for p in (pair.cert, pair.key) if p.exists()]
        raise ConfigError(f"{' and '.join(present)} already exist; not overwriting (delete both to reissue)")
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_new(pair.key, key_pem, 0o600)
    _write_new(pair.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _directory(directory: str | Path) -> Path:
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path} exists and is not a directory")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the directory {path}: {exc}") from exc
    return path


def make_ca(directory: str | Path, name: str = DEFAULT_CA_NAME, *, days: int = CA_DAYS) -> KeyPair:
    """Write a self-signed CA, ``ca.pem`` and ``ca.key``, in ``directory``. Never overwrites."""
    pair = KeyPair.at(_directory(directory), "ca")
    if not name.strip():
        raise ConfigError("the CA needs a name")
    key = _new_key()
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "edgeagent"),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )
    now = dt.datetime.now(dt.timezone.utc)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_pair(pair, cert, key)
    return pair


def issue(
    directory: str | Path,
    ca: KeyPair,
    common_name: str,
    *,
    hosts: Sequence[str] = (),
    client: bool,
    stem: str | None = None,
    days: int = LEAF_DAYS,
) -> KeyPair:
    """Write ``STEM.pem`` and ``STEM.key`` (``STEM`` defaults to ``common_name``) signed by ``ca``.

    ``hosts`` (DNS names and IP addresses) go into the subjectAltName, which is what clients check the
    broker's address against. ``client`` makes a TLS client certificate (extendedKeyUsage clientAuth: a
    device), otherwise a server one (serverAuth: the broker). Never overwrites.
    """
    stem = stem or common_name
    _check_stem(stem, "certificate name")
    if not common_name.strip():
        raise ConfigError("a certificate needs a common name")
    if not client and not hosts:
        raise ConfigError(
            f"the server certificate {stem} needs at least one host (a name or IP the broker is reached by)"
        )
    names = list(dict.fromkeys(parse_host(h) for h in hosts))
    pair = KeyPair.at(_directory(directory), stem)
    ca_cert, ca_key = ca.load_certificate(), ca.load_key()
    if ca_key.public_key() != ca_cert.public_key():
        raise ConfigError(f"{ca.key} is not the key of {ca.cert}; restore the CA's matching pair")
    key = _new_key()
    now = dt.datetime.now(dt.timezone.utc)
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "edgeagent"),
                    x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    _write_pair(pair, builder.sign(ca_key, hashes.SHA256()), key)
    return pair


def san_hosts(cert: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses in a certificate's subjectAltName, as strings."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [
        *san.get_values_for_type(x509.DNSName),
        *(str(ip) for ip in san.get_values_for_type(x509.IPAddress)),
    ]


@dataclass
class Site:
    """What :func:`init_site` did: the files it wrote, the pairs it kept, and notes for the operator."""

    directory: Path
    ca: KeyPair
    broker: KeyPair
    devices: dict[str, KeyPair]
    written: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _verify_issued_by(pair: KeyPair, ca_cert: x509.Certificate) -> None:
    try:
        pair.load_certificate().verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise ConfigError(
            f"{pair.cert} was not issued by the CA in {pair.cert.parent / 'ca.pem'}; "
            f"delete {pair.cert.name} and {pair.key.name} to reissue it"
        ) from exc


def _keep(pair: KeyPair, site: Site) -> bool:
    """Whether ``pair`` is already there (both files, so it is kept); a half pair is an error."""
    if pair.cert.exists() and pair.key.exists():
        site.kept += [pair.cert, pair.key]
        return True
    if pair.exists():
        present, missing = (pair.cert, pair.key) if pair.cert.exists() else (pair.key, pair.cert)
        raise ConfigError(
            f"{present} exists but {missing} does not; restore it, or delete {present} to reissue"
        )
    return False


def init_site(
    directory: str | Path,
    broker_hosts: Iterable[str],
    devices: Iterable[str],
    *,
    ca_name: str = DEFAULT_CA_NAME,
) -> Site:
    """Create the site's PKI in ``directory``: ``ca.pem``/``ca.key``, ``broker.pem``/``broker.key`` for
    ``broker_hosts`` (plus ``localhost`` and ``127.0.0.1``) and ``DEVICE.pem``/``DEVICE.key`` per device.

    Idempotent: existing pairs are kept (and checked against the CA), only missing ones are written.
    """
    directory = _directory(directory)
    hosts = list(dict.fromkeys([*(h.strip() for h in broker_hosts), "localhost", "127.0.0.1"]))
    for h in hosts:
        parse_host(h)  # refuse a bad host before writing anything
    device_list = list(dict.fromkeys(devices))
    for device in device_list:
        _check_stem(device, "device id")
        if device in RESERVED_STEMS:
            raise ConfigError(f"device id {device!r} is taken by the site's own {device}.pem; choose another")
    site = Site(
        directory=directory,
        ca=KeyPair.at(directory, "ca"),
        broker=KeyPair.at(directory, "broker"),
        devices={d: KeyPair.at(directory, d) for d in device_list},
    )
    leaves = [site.broker, *site.devices.values()]
    if not _keep(site.ca, site):
        # A new CA cannot vouch for certificates that an earlier one signed.
        stale = [p.cert for p in leaves if p.exists()]
        if stale:
            raise ConfigError(
                f"{site.ca.cert} is missing but {', '.join(map(str, stale))} exist(s): they were signed by "
                "the old CA; restore ca.pem and ca.key, or delete those files to start the site afresh"
            )
        make_ca(directory, ca_name)
        site.written += [site.ca.cert, site.ca.key]
    ca_cert = site.ca.load_certificate()

    if _keep(site.broker, site):
        _verify_issued_by(site.broker, ca_cert)
        covered = {h.lower() for h in san_hosts(site.broker.load_certificate())}
        missing = [h for h in hosts if str(parse_host(h).value).lower() not in covered]
        if missing:
            site.notes.append(
                f"the existing {site.broker.cert.name} does not cover {', '.join(missing)}; delete "
                f"{site.broker.cert.name} and {site.broker.key.name} and run again to reissue it"
            )
    else:
        issue(directory, site.ca, hosts[0], hosts=hosts, client=False, stem="broker")
        site.written += [site.broker.cert, site.broker.key]

    for device, pair in site.devices.items():
        if _keep(pair, site):
            _verify_issued_by(pair, ca_cert)
        else:
            issue(directory, site.ca, device, client=True)
            site.written += [pair.cert, pair.key]
    return site


@click.command("certs")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--host",
    "hosts",
    multiple=True,
    metavar="NAME|IP",
    help="A DNS name or IP address the broker is reached by (repeat; localhost and 127.0.0.1 are always in).",
)
@click.option(
    "--device",
    "devices",
    multiple=True,
    metavar="ID",
    help="A device id to issue a client certificate for (repeat).",
)
def certs_command(directory: Path, hosts: tuple[str, ...], devices: tuple[str, ...]) -> None:
    """Make (or complete) the site's TLS certificates in DIRECTORY: a CA, the broker's and one per device.

    Existing files are never overwritten: run it again with more --device to add devices.
    """
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
        f"    edgeagent broker --host 0.0.0.0 --port 8883 --credentials DIR --tls-cert {d / 'broker.pem'} "
        f"--tls-key {d / 'broker.key'} --tls-ca {d / 'ca.pem'} --require-client-cert\n"
        "  each worker (and the central node, with its own device certificate):\n"
        f"    edgeagent worker --broker mqtts://{host}:8883 --ca-file ca.pem --cert-file {example}.pem "
        f"--key-file {example}.key ..."
    )
