"""TLS end to end: the site PKI of ``edgeagent certs``, the embedded amqtt broker's mqtts:// listener and
paho clients (``MqttTransport``), and the same certificates on Mosquitto.

Every refusal is shown twice: the paho client never connects, and a raw TLS client (``probe``) sees the
handshake fail (``ssl.SSLError``) or the broker drop the connection instead of answering CONNECT. Nothing
sleeps: the positive cases wait on events, the raw probes block on the socket (with a time-out that fails
the test), and "never connects" waits one short window for a whole group of clients at once.

Note: under TLS 1.3 the client's handshake completes before the server has checked the client's
certificate; a refused client certificate then shows as the connection being closed without a CONNACK.
Under TLS 1.2 it is a handshake error. The server-side refusals are probed both ways.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import stat
import threading
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from edgeagent.broker import BrokerTls, EmbeddedBroker, broker_config
from edgeagent.broker.certs import KeyPair, Site, init_site, issue, make_ca, san_hosts
from edgeagent.cli.broker import certs_command
from edgeagent.errors import ConfigError
from edgeagent.transport.mqtt import MqttTransport, TlsOptions

CONNECT_TIMEOUT = 10.0
DELIVERY_TIMEOUT = 10.0
# How long refused paho clients are given to (not) connect: they try at once and again after 1 s.
REFUSE_WINDOW = 2.0
SOCKET_TIMEOUT = 10.0
CONNACK_ACCEPTED = b"\x20\x02\x00\x00"

E = TypeVar("E", bound=x509.ExtensionType)


@dataclass(frozen=True)
class Pki:
    site: Site  # the real site: ca, broker (localhost, 127.0.0.1), dev-1
    other: Site  # another site's CA, broker and dev-1: certificates that must not be accepted
    misnamed: KeyPair  # a broker certificate from the site CA, but for elsewhere.example only


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    site = init_site(tmp_path_factory.mktemp("site"), ["localhost", "127.0.0.1"], ["dev-1"])
    other = init_site(tmp_path_factory.mktemp("other"), ["localhost", "127.0.0.1"], ["dev-1"])
    misnamed = issue(
        site.directory,
        site.ca,
        "elsewhere.example",
        hosts=["elsewhere.example"],
        client=False,
        stem="misnamed",
    )
    return Pki(site, other, misnamed)


@contextmanager
def tls_broker(
    server: KeyPair, *, ca: KeyPair | None = None, require_client_cert: bool = False
) -> Iterator[EmbeddedBroker]:
    tls = BrokerTls(str(server.cert), str(server.key), str(ca.cert) if ca else None, require_client_cert)
    broker = EmbeddedBroker(tls=tls).start()
    try:
        yield broker
    finally:
        broker.stop()


def options(ca: KeyPair, client: KeyPair | None = None) -> TlsOptions:
    return TlsOptions(
        ca_file=str(ca.cert),
        cert_file=str(client.cert) if client else None,
        key_file=str(client.key) if client else None,
    )


@contextmanager
def clients(url: str, *tls: TlsOptions | None) -> Iterator[list[MqttTransport]]:
    """One MqttTransport per TLS option set, all started at once, closed whatever happens."""
    made: list[MqttTransport] = []
    try:
        for opts in tls:
            made.append(MqttTransport(url, f"tls-{uuid.uuid4().hex[:8]}", tls=opts, max_backoff=1.0))
        yield made
    finally:
        for t in made:
            t.close()


def assert_never_connect(transports: list[MqttTransport]) -> None:
    # One window for the whole group (they were started together): none may connect in it.
    transports[0].wait_connected(REFUSE_WINDOW)
    connected = [t.client_id for t in transports if t.connected]
    assert not connected, f"{connected} connected although their TLS setup must be refused"


def connect_packet() -> bytes:
    """An MQTT 3.1.1 CONNECT (clean session, keep-alive 10 s) with a fresh client id."""
    client_id = f"probe-{uuid.uuid4().hex[:8]}".encode()
    variable = b"\x00\x04MQTT\x04\x02\x00\x0a"
    payload = len(client_id).to_bytes(2, "big") + client_id
    return bytes([0x10, len(variable) + len(payload)]) + variable + payload


def probe(
    port: int,
    *,
    ca: KeyPair,
    client: KeyPair | None = None,
    host: str = "127.0.0.1",
    tls12: bool = False,
) -> bytes:
    """A raw TLS client: handshake, send CONNECT, return the first 4 bytes of the answer (b"" when the
    broker closes the connection). A refused handshake raises ``ssl.SSLError``."""
    context = ssl.create_default_context(cafile=str(ca.cert))
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT) as raw,
        context.wrap_socket(raw, server_hostname=host) as sock,
    ):
        sock.sendall(connect_packet())
        return read_answer(sock)


def read_answer(sock: socket.socket) -> bytes:
    answer = b""
    while len(answer) < 4:
        chunk = sock.recv(4 - len(answer))
        if not chunk:
            break
        answer += chunk
    return answer


def assert_refused_by_broker(port: int, *, ca: KeyPair, client: KeyPair | None) -> None:
    """The broker refuses this client certificate (or its absence), under TLS 1.2 and TLS 1.3."""
    with pytest.raises((ssl.SSLError, ConnectionError)):
        probe(port, ca=ca, client=client, tls12=True)
    try:
        answer = probe(port, ca=ca, client=client)
    except (ssl.SSLError, ConnectionError):
        return
    assert answer == b"", f"the broker answered {answer!r} instead of closing the connection"


# -- the embedded broker ---------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])  # the IP and the DNS subjectAltName
def test_client_trusting_the_site_ca_connects_and_round_trips(pki: Pki, host: str) -> None:
    site = pki.site
    with tls_broker(site.broker) as broker:
        url = f"mqtts://{host}:{broker.port}"
        assert probe(broker.port, ca=site.ca, host=host) == CONNACK_ACCEPTED
        with clients(url, options(site.ca), options(site.ca)) as (sub, pub):
            assert sub.wait_connected(CONNECT_TIMEOUT), f"no TLS connection to {url}"
            assert pub.wait_connected(CONNECT_TIMEOUT)
            got = threading.Event()
            received: list[bytes] = []

            def handler(topic: str, payload: bytes) -> None:
                received.append(payload)
                got.set()

            topic = f"t{uuid.uuid4().hex[:8]}/tls"
            sub.subscribe(topic, handler)
            # Retained: delivered whether the SUBSCRIBE reaches the broker before or after the PUBLISH.
            pub.publish(topic, b"over tls", retain=True)
            assert got.wait(DELIVERY_TIMEOUT), "the message did not come back over TLS"
            assert received[0] == b"over tls"


def test_a_broker_certificate_from_another_ca_is_refused(pki: Pki) -> None:
    # An impostor broker with a certificate for the right host, signed by another CA.
    with tls_broker(pki.other.broker) as broker:
        with pytest.raises(ssl.SSLCertVerificationError) as err:
            probe(broker.port, ca=pki.site.ca)
        assert err.value.verify_message == "unable to get local issuer certificate"
        with clients(broker.url, options(pki.site.ca)) as made:
            assert_never_connect(made)


@pytest.mark.parametrize(("host", "mismatch"), [("127.0.0.1", "IP address"), ("localhost", "Hostname")])
def test_a_broker_certificate_for_another_host_is_refused(pki: Pki, host: str, mismatch: str) -> None:
    # Signed by the right CA, but for elsewhere.example: hostname verification is on.
    with tls_broker(pki.misnamed) as broker:
        with pytest.raises(ssl.SSLCertVerificationError) as err:
            probe(broker.port, ca=pki.site.ca, host=host)
        assert err.value.verify_message.startswith(f"{mismatch} mismatch")
        with clients(f"mqtts://{host}:{broker.port}", options(pki.site.ca)) as made:
            assert_never_connect(made)


def test_a_plain_mqtt_client_does_not_connect_to_the_tls_port(pki: Pki) -> None:
    with tls_broker(pki.site.broker) as broker:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=SOCKET_TIMEOUT) as sock:
            sock.sendall(connect_packet())
            try:
                answer = read_answer(sock)
            except ConnectionError:
                answer = b""
        assert answer == b"", f"the TLS listener answered a plain CONNECT with {answer!r}"
        with clients(f"mqtt://127.0.0.1:{broker.port}", None) as made:
            assert_never_connect(made)


def bad_clients(pki: Pki) -> dict[str, KeyPair | None]:
    return {
        "other-ca": pki.other.devices["dev-1"],  # a device certificate from another site's CA
        "no-cert": None,
        "server-cert": pki.site.broker,  # the site's own, but a server certificate (no clientAuth use)
    }


@pytest.mark.parametrize("bad", ["other-ca", "no-cert", "server-cert"])
def test_require_client_cert_refuses_bad_clients_at_the_handshake(pki: Pki, bad: str) -> None:
    site = pki.site
    with tls_broker(site.broker, ca=site.ca, require_client_cert=True) as broker:
        assert_refused_by_broker(broker.port, ca=site.ca, client=bad_clients(pki)[bad])
        assert probe(broker.port, ca=site.ca, client=site.devices["dev-1"]) == CONNACK_ACCEPTED


def test_require_client_cert_admits_only_the_device_with_its_certificate(pki: Pki) -> None:
    site = pki.site
    bad = [options(site.ca, client) for client in bad_clients(pki).values()]
    with (
        tls_broker(site.broker, ca=site.ca, require_client_cert=True) as broker,
        clients(broker.url, options(site.ca, site.devices["dev-1"]), *bad) as (good, *refused),
    ):
        assert good.wait_connected(CONNECT_TIMEOUT), "a device with its site certificate was refused"
        assert_never_connect(refused)


def test_ca_without_require_refuses_a_foreign_certificate_but_admits_none(pki: Pki) -> None:
    site = pki.site
    with tls_broker(site.broker, ca=site.ca) as broker:
        assert_refused_by_broker(broker.port, ca=site.ca, client=pki.other.devices["dev-1"])
        assert probe(broker.port, ca=site.ca) == CONNACK_ACCEPTED
        assert probe(broker.port, ca=site.ca, client=site.devices["dev-1"]) == CONNACK_ACCEPTED


def test_the_broker_refuses_tls_1_1(pki: Pki) -> None:
    with tls_broker(pki.site.broker) as broker, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLSVersion.TLSv1_1 itself
        context = ssl.create_default_context(cafile=str(pki.site.ca.cert))
        context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_1
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client offer TLS 1.1 at all
        with (
            socket.create_connection(("127.0.0.1", broker.port), timeout=SOCKET_TIMEOUT) as raw,
            pytest.raises(ssl.SSLError) as err,
        ):
            context.wrap_socket(raw, server_hostname="127.0.0.1")
        if err.value.reason == "NO_PROTOCOLS_AVAILABLE":
            pytest.skip("this OpenSSL cannot offer TLS 1.1 even at security level 0")


def test_broker_tls_settings_are_checked(pki: Pki, tmp_path: Path) -> None:
    site = pki.site
    with pytest.raises(ConfigError, match="require_client_cert needs ca_file"):
        broker_config(
            "127.0.0.1", 8883, tls=BrokerTls(str(site.broker.cert), str(site.broker.key), None, True)
        )
    with pytest.raises(ConfigError, match="does not exist"):
        broker_config("127.0.0.1", 8883, tls=BrokerTls(str(tmp_path / "none.pem"), str(site.broker.key)))
    config = broker_config(
        "127.0.0.1", 8883, tls=BrokerTls(str(site.broker.cert), str(site.broker.key), str(site.ca.cert), True)
    )
    listener = config["listeners"]["default"]
    assert listener["ssl"] is True and listener["cafile"] == str(site.ca.cert)


def test_client_tls_files_are_checked(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot load the TLS files"):
        MqttTransport("mqtts://127.0.0.1:8883", "x", tls=TlsOptions(ca_file=str(tmp_path / "missing.pem")))
    mismatched = TlsOptions(
        str(pki.site.ca.cert), str(pki.site.devices["dev-1"].cert), str(pki.site.broker.key)
    )
    with pytest.raises(ConfigError, match="cannot load the TLS files"):
        MqttTransport("mqtts://127.0.0.1:8883", "x", tls=mismatched)
    with pytest.raises(ConfigError, match="needs its certificate"):
        MqttTransport("mqtts://127.0.0.1:8883", "x", tls=TlsOptions(key_file=str(pki.site.broker.key)))


# -- Mosquitto with the same certificates ----------------------------------------------------


@pytest.mark.mosquitto
def test_mosquitto_accepts_the_site_certificates_and_refuses_a_foreign_one(pki: Pki, tmp_path: Path) -> None:
    if shutil.which("mosquitto") is None:
        pytest.skip("the mosquitto binary is not installed (apt-get install mosquitto)")
    from tests.conftest import MosquittoProcess

    site = pki.site
    proc = MosquittoProcess(tmp_path)
    proc.conf.write_text(
        f"listener {proc.port} 127.0.0.1\n"
        f"cafile {site.ca.cert}\ncertfile {site.broker.cert}\nkeyfile {site.broker.key}\n"
        "require_certificate true\nuse_identity_as_username true\nallow_anonymous false\n"
        # Run as root (as in CI), Mosquitto would switch to the `mosquitto` user, which cannot read the
        # 0600 key in a 0700 directory; as any other user this line does nothing.
        "user root\n"
        "persistence false\nlog_dest stderr\nlog_type error\n"
    )
    proc.start()
    try:
        device = site.devices["dev-1"]
        url = f"mqtts://127.0.0.1:{proc.port}"
        assert probe(proc.port, ca=site.ca, client=device) == CONNACK_ACCEPTED
        assert_refused_by_broker(proc.port, ca=site.ca, client=pki.other.devices["dev-1"])
        assert_refused_by_broker(proc.port, ca=site.ca, client=None)
        assert_refused_by_broker(proc.port, ca=site.ca, client=site.broker)  # a server cert as a client's
        with pytest.raises(ssl.SSLCertVerificationError):
            probe(proc.port, ca=pki.other.ca, client=pki.other.devices["dev-1"])  # the broker is not theirs
        with clients(url, options(site.ca, device), options(site.ca, pki.other.devices["dev-1"])) as made:
            good, foreign = made
            assert good.wait_connected(CONNECT_TIMEOUT), (
                "Mosquitto refused a device with its site certificate"
            )
            got = threading.Event()
            topic = f"t{uuid.uuid4().hex[:8]}/tls"
            good.subscribe(topic, lambda _t, payload: got.set() if payload == b"ping" else None)
            good.publish(topic, b"ping", retain=True)
            assert got.wait(DELIVERY_TIMEOUT), "the message did not come back over TLS through Mosquitto"
            assert_never_connect([foreign])
    finally:
        proc.stop()


# -- the certificates themselves ---------------------------------------------------------------


def _ext(cert: x509.Certificate, kind: type[E]) -> E:
    return cert.extensions.get_extension_for_class(kind).value


def test_site_certificates(tmp_path: Path) -> None:
    site = init_site(tmp_path / "site", ["pi-broker.local", "192.168.1.10", "fd00::1"], ["dev-1", "central"])
    ca = site.ca.load_certificate()
    broker = site.broker.load_certificate()

    san = _ext(broker, x509.SubjectAlternativeName)
    assert set(san.get_values_for_type(x509.DNSName)) == {"pi-broker.local", "localhost"}
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {
        "192.168.1.10",
        "fd00::1",
        "127.0.0.1",
    }
    assert san_hosts(broker)[0] == "pi-broker.local"

    ca_bc = _ext(ca, x509.BasicConstraints)
    assert ca_bc.ca and ca_bc.path_length == 0
    days = (ca.not_valid_after_utc - ca.not_valid_before_utc).days
    assert 3640 <= days <= 3660
    for pair, usage in [
        (site.broker, ExtendedKeyUsageOID.SERVER_AUTH),
        (site.devices["dev-1"], ExtendedKeyUsageOID.CLIENT_AUTH),
        (site.devices["central"], ExtendedKeyUsageOID.CLIENT_AUTH),
    ]:
        cert = pair.load_certificate()
        cert.verify_directly_issued_by(ca)
        assert list(_ext(cert, x509.ExtendedKeyUsage)) == [usage]
        bc = _ext(cert, x509.BasicConstraints)
        assert not bc.ca
        assert 725 <= (cert.not_valid_after_utc - cert.not_valid_before_utc).days <= 735
        assert isinstance(pair.load_key().curve, ec.SECP256R1)
    device = site.devices["dev-1"].load_certificate()
    assert device.subject.rfc4514_string() == "CN=dev-1,O=edgeagent"

    for path in site.directory.iterdir():
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o600 if path.suffix == ".key" else 0o644), f"{path.name}: {oct(mode)}"
    assert stat.S_IMODE(site.directory.stat().st_mode) == 0o700


def test_init_site_is_idempotent_and_adds_devices(tmp_path: Path) -> None:
    first = init_site(tmp_path, ["localhost"], ["dev-1"])
    assert len(first.written) == 6 and not first.kept
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    again = init_site(tmp_path, ["localhost"], ["dev-1"])
    assert again.written == [] and len(again.kept) == 6 and again.notes == []
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before

    more = init_site(tmp_path, ["localhost", "pi-broker.local"], ["dev-1", "dev-2"])
    assert more.written == [tmp_path / "dev-2.pem", tmp_path / "dev-2.key"]
    more.devices["dev-2"].load_certificate().verify_directly_issued_by(first.ca.load_certificate())
    assert any("does not cover pi-broker.local" in note for note in more.notes)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in before} == before


def test_init_site_refuses_inconsistent_or_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither an IP address nor a DNS name"):
        init_site(tmp_path / "a", ["bad host!"], [])
    assert not (tmp_path / "a" / "ca.pem").exists()  # nothing written before the check
    with pytest.raises(ConfigError, match="taken by the site's own"):
        init_site(tmp_path / "b", [], ["broker"])
    with pytest.raises(ConfigError, match="cannot name a file"):
        init_site(tmp_path / "c", [], ["../evil"])

    site = init_site(tmp_path / "d", [], ["dev-1"])
    site.devices["dev-1"].key.unlink()
    with pytest.raises(ConfigError, match=r"dev-1\.pem exists but .*dev-1\.key does not"):
        init_site(tmp_path / "d", [], ["dev-1"])
    site.ca.cert.unlink()
    site.ca.key.unlink()
    with pytest.raises(ConfigError, match="signed by the old CA"):
        init_site(tmp_path / "d", [], [])

    # A pair signed by another CA is not silently kept.
    foreign_ca = make_ca(tmp_path / "foreign")
    make_ca(tmp_path / "e")
    issue(tmp_path / "e", foreign_ca, "dev-9", client=True)
    with pytest.raises(ConfigError, match="was not issued by the CA"):
        init_site(tmp_path / "e", [], ["dev-9"])

    with pytest.raises(ConfigError, match="already exist"):
        make_ca(tmp_path / "foreign")
    with pytest.raises(ConfigError, match="is not the key of"):
        issue(tmp_path / "f", KeyPair(foreign_ca.cert, tmp_path / "e" / "ca.key"), "dev-1", client=True)
    with pytest.raises(ConfigError, match="needs at least one host"):
        issue(tmp_path / "foreign", foreign_ca, "srv", client=False)


def test_certs_command(tmp_path: Path) -> None:
    runner = CliRunner()
    site = tmp_path / "site"
    result = runner.invoke(
        certs_command, ["--certs-dir", str(site), "--host", "pi-broker.local", "--device", "dev-1"]
    )
    assert result.exit_code == 0, result.output
    assert f"wrote {site / 'ca.key'} (private key, mode 0600)" in result.output
    assert "valid for: pi-broker.local, localhost, 127.0.0.1" in result.output
    assert f"--cert-file {site / 'broker.pem'}" in result.output and "--require-client-cert" in result.output
    assert "--broker mqtts://pi-broker.local:8883 --ca-file ca.pem --cert-file dev-1.pem" in result.output

    result = runner.invoke(
        certs_command, ["--certs-dir", str(site), "--host", "pi-broker.local", "--device", "dev-1"]
    )
    assert result.exit_code == 0, result.output
    assert "nothing to write" in result.output and "wrote" not in result.output

    result = runner.invoke(certs_command, ["--certs-dir", str(site), "--host", "-bad-"])
    assert result.exit_code != 0 and "neither an IP address nor a DNS name" in result.output
    assert sorted(os.listdir(site)) == sorted(
        ["ca.pem", "ca.key", "broker.pem", "broker.key", "dev-1.pem", "dev-1.key"]
    )
