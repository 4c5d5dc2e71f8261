"""TLS and mutual TLS for ``ratelimit serve``: certificates made here (a CA, a server and a
client certificate it signed, and an unrelated CA with a client of its own), real
``python -m ratelimit serve`` processes and real gRPC clients doing real handshakes on
loopback; and a bad configuration stopping the service at start, naming the variable."""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ratelimit.cli.command import main as cli
from ratelimit.cli.common import FAILED
from ratelimit.errors import ConfigurationError
from ratelimit.service.config import ServiceConfig
from ratelimit.service.proto import ratio_pb2, ratio_pb2_grpc
from tests.service_process import ROOT, ServiceProcess

pytestmark = pytest.mark.timeout(120)
REFUSED_WITHIN = 5.0
"""The deadline of a call that is expected to fail: it fails in the handshake, long before."""


# --- certificates ---


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path

    @property
    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()

    @property
    def key_pem(self) -> bytes:
        return self.key.read_bytes()


class Authority:
    """A CA that signs leaf certificates into ``folder``."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            _builder(self.name, self.name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_ca_usage(), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = folder / f"{name}.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, name: str, usage: x509.ObjectIdentifier, alt: list[x509.GeneralName] | None = None
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (
            _builder(subject, self.name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(self.folder / f"{name}.pem", self.folder / f"{name}.key")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(_pem(key))
        return issued


def _builder(
    subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _ca_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


def _pem(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption = (
        serialization.NoEncryption()
        if password is None
        else serialization.BestAvailableEncryption(password)
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


@dataclass(frozen=True)
class Pki:
    ca: Authority
    server: Issued
    client: Issued
    other_ca: Authority
    other_client: Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = Authority(folder, "ca"), Authority(folder, "other-ca")
    names: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    return Pki(
        ca=ca,
        server=ca.issue("server", ExtendedKeyUsageOID.SERVER_AUTH, names),
        client=ca.issue("client", ExtendedKeyUsageOID.CLIENT_AUTH),
        other_ca=other,
        other_client=other.issue("other-client", ExtendedKeyUsageOID.CLIENT_AUTH),
    )


def tls_env(pki: Pki, client_ca: bool = False) -> dict[str, str]:
    env = {"RATELIMIT_TLS_CERT": str(pki.server.cert), "RATELIMIT_TLS_KEY": str(pki.server.key)}
    if client_ca:
        env["RATELIMIT_TLS_CLIENT_CA"] = str(pki.ca.pem)
    return env


# --- real handshakes ---


def trusting(ca: Authority, client: Issued | None = None) -> grpc.ChannelCredentials:
    """A client's credentials: it trusts ``ca``, and shows ``client``'s certificate."""
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=ca.pem.read_bytes())
    return grpc.ssl_channel_credentials(
        root_certificates=ca.pem.read_bytes(),
        private_key=client.key_pem,
        certificate_chain=client.cert_pem,
    )


def channel(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own, every time
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, credentials, options=options)


async def answered(address: str, credentials: grpc.ChannelCredentials, owner: str) -> None:
    """A ratio ``RateLimit`` call and a health check, both answered."""
    async with channel(address, credentials) as opened:
        ratio = ratio_pb2_grpc.RateLimitServiceStub(opened)
        ask = ratio_pb2.RateLimitRequest(owner=owner, resource="search")
        answer = await ratio.RateLimit(ask, timeout=30)
        assert answer.code == ratio_pb2.RateLimitResponse.OK
        health = health_pb2_grpc.HealthStub(opened)
        checked = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert checked.status == health_pb2.HealthCheckResponse.SERVING


async def refused(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """The status of a ratio call that the handshake should stop, within a short deadline."""
    async with channel(address, credentials) as opened:
        ratio = ratio_pb2_grpc.RateLimitServiceStub(opened)
        ask = ratio_pb2.RateLimitRequest(owner="refused", resource="search")
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await ratio.RateLimit(ask, timeout=REFUSED_WITHIN)
    return failed.value.code()


@pytest.fixture(scope="module")
def tls_service(pki: Pki) -> Iterator[ServiceProcess]:
    with ServiceProcess(tls_env(pki)) as running:
        yield running


@pytest.fixture(scope="module")
def mutual_service(pki: Pki) -> Iterator[ServiceProcess]:
    with ServiceProcess(tls_env(pki, client_ca=True)) as running:
        yield running


async def test_tls_answers_a_client_that_trusts_the_ca(
    tls_service: ServiceProcess, pki: Pki
) -> None:
    assert any(line.endswith(", TLS)") for line in tls_service.lines), tls_service.output
    await answered(tls_service.address, trusting(pki.ca), "tls")
    # a client certificate is not asked for, and does no harm when shown
    await answered(tls_service.address, trusting(pki.ca, pki.client), "tls-with-cert")


async def test_tls_refuses_plain_text_and_a_client_that_trusts_another_ca(
    tls_service: ServiceProcess, pki: Pki
) -> None:
    assert await refused(tls_service.address, None) == grpc.StatusCode.UNAVAILABLE
    async with channel(tls_service.address, trusting(pki.other_ca)) as opened:
        ratio = ratio_pb2_grpc.RateLimitServiceStub(opened)
        ask = ratio_pb2.RateLimitRequest(owner="refused", resource="search")
        with pytest.raises(grpc.aio.AioRpcError) as untrusted:
            await ratio.RateLimit(ask, timeout=REFUSED_WITHIN)
    assert untrusted.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "CERTIFICATE_VERIFY_FAILED" in (untrusted.value.details() or "")  # the client's check


async def test_mutual_tls_answers_only_a_client_certificate_the_ca_signed(
    mutual_service: ServiceProcess, pki: Pki
) -> None:
    assert any(line.endswith(", TLS with client certificates)") for line in mutual_service.lines)
    address = mutual_service.address
    assert await refused(address, trusting(pki.ca)) == grpc.StatusCode.UNAVAILABLE
    assert await refused(address, trusting(pki.ca, pki.other_client)) == (
        grpc.StatusCode.UNAVAILABLE
    )
    assert await refused(address, None) == grpc.StatusCode.UNAVAILABLE
    await answered(address, trusting(pki.ca, pki.client), "mutual")


# --- bad configuration ---


@pytest.fixture(scope="module")
def strays(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files that are wrong as TLS files: not PEM, a key of another certificate, a key that is
    encrypted."""
    folder = tmp_path_factory.mktemp("strays")
    junk = folder / "junk.pem"
    junk.write_text("not a certificate\n")
    encrypted = folder / "encrypted.key"
    encrypted.write_bytes(_pem(ec.generate_private_key(ec.SECP256R1()), b"secret"))
    return {"junk": junk, "missing": folder / "missing.pem", "encrypted": encrypted}


def test_tls_configuration_from_the_environment(pki: Pki) -> None:
    config = ServiceConfig.from_env(tls_env(pki))
    assert (config.tls_cert, config.tls_key) == (str(pki.server.cert), str(pki.server.key))
    assert config.tls_client_ca is None
    mutual = ServiceConfig.from_env(tls_env(pki, client_ca=True))
    assert mutual.tls_client_ca == str(pki.ca.pem)
    assert ServiceConfig.from_env({"RATELIMIT_TLS_CERT": " "}) == ServiceConfig()  # unset


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("cert without key", "RATELIMIT_TLS_CERT='.*server.pem' needs RATELIMIT_TLS_KEY"),
        ("key without cert", "RATELIMIT_TLS_KEY='.*server.key' needs RATELIMIT_TLS_CERT"),
        ("client CA alone", "RATELIMIT_TLS_CLIENT_CA='.*ca.pem' needs RATELIMIT_TLS_CERT and"),
        ("missing cert", "RATELIMIT_TLS_CERT='.*missing.pem': cannot read it"),
        ("a folder as key", "RATELIMIT_TLS_KEY='.*': cannot read it"),
        ("missing client CA", "RATELIMIT_TLS_CLIENT_CA='.*missing.pem': cannot read it"),
        ("cert not PEM", "RATELIMIT_TLS_CERT='.*junk.pem': no PEM certificate"),
        ("key not PEM", "RATELIMIT_TLS_KEY='.*junk.pem': no PEM private key"),
        ("key of another cert", "RATELIMIT_TLS_KEY='.*client.key' is not the private key of"),
        ("encrypted key", "RATELIMIT_TLS_KEY='.*encrypted.key': the key is encrypted"),
        ("client CA not PEM", "RATELIMIT_TLS_CLIENT_CA='.*junk.pem': no PEM certificate"),
    ],
)
def test_a_bad_tls_configuration_is_named(
    pki: Pki, strays: dict[str, Path], case: str, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ServiceConfig.from_env(bad_env(pki, strays, case))


def bad_env(pki: Pki, strays: dict[str, Path], case: str) -> dict[str, str]:
    env = tls_env(pki)
    changes: dict[str, tuple[str, Path | None]] = {
        "cert without key": ("RATELIMIT_TLS_KEY", None),
        "key without cert": ("RATELIMIT_TLS_CERT", None),
        "missing cert": ("RATELIMIT_TLS_CERT", strays["missing"]),
        "a folder as key": ("RATELIMIT_TLS_KEY", strays["missing"].parent),
        "missing client CA": ("RATELIMIT_TLS_CLIENT_CA", strays["missing"]),
        "cert not PEM": ("RATELIMIT_TLS_CERT", strays["junk"]),
        "key not PEM": ("RATELIMIT_TLS_KEY", strays["junk"]),
        "key of another cert": ("RATELIMIT_TLS_KEY", pki.client.key),
        "encrypted key": ("RATELIMIT_TLS_KEY", strays["encrypted"]),
        "client CA not PEM": ("RATELIMIT_TLS_CLIENT_CA", strays["junk"]),
    }
    if case == "client CA alone":
        return {"RATELIMIT_TLS_CLIENT_CA": str(pki.ca.pem)}
    variable, path = changes[case]
    if path is None:
        del env[variable]
    else:
        env[variable] = str(path)
    return env


@pytest.mark.parametrize(
    ("case", "variable"),
    [
        ("key without cert", "RATELIMIT_TLS_KEY"),
        ("missing cert", "RATELIMIT_TLS_CERT"),
        ("key of another cert", "RATELIMIT_TLS_KEY"),
    ],
)
def test_a_bad_tls_configuration_stops_the_service_at_start(
    pki: Pki, strays: dict[str, Path], case: str, variable: str
) -> None:
    outside = {k: v for k, v in os.environ.items() if not k.startswith("RATELIMIT_TLS_")}
    env = {**outside, "RATELIMIT_HOST": "127.0.0.1", "RATELIMIT_PORT": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "ratelimit", "serve"],
        env={**env, **bad_env(pki, strays, case)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == FAILED, done.stderr
    assert f"cannot start: {variable}=" in done.stderr
    assert "serving on" not in done.stdout


def test_the_tls_flags_reach_the_configuration(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ServiceConfig] = []

    async def serve(config: ServiceConfig) -> None:
        seen.append(config)

    monkeypatch.setattr("ratelimit.service.server.serve", serve)
    for variable in ("RATELIMIT_TLS_CERT", "RATELIMIT_TLS_KEY", "RATELIMIT_TLS_CLIENT_CA"):
        monkeypatch.delenv(variable, raising=False)
    cert, key, ca = str(pki.server.cert), str(pki.server.key), str(pki.ca.pem)
    assert cli(["serve", "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca]) == 0
    assert [(c.tls_cert, c.tls_key, c.tls_client_ca) for c in seen] == [(cert, key, ca)]
    assert cli(["serve", "--tls-key", key]) == FAILED  # checked as the variables are
