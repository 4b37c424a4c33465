"""Secured services, as production clusters are set up: `stack up --with kafka-sasl registry-auth`.

`kafka-sasl` is a second KRaft broker whose only client listener is SASL_SSL with SCRAM-SHA-512:
a certificate authority and the broker's certificate are made afresh at every start (clients
trust `tls/ca.pem` under the service folder), and the SCRAM users are created when its storage
is formatted. It is a broker of its own, so the plaintext broker the rest of the suite uses is
never restarted, and nothing is paid for it unless asked.

`registry-auth` puts HTTP basic auth in front of the stack's Apicurio Registry. Apicurio 3.x
checks basic credentials only by exchanging them for a token at an OIDC server (its
`apicurio.authn.basic-client-credentials.enabled` needs Keycloak or the like), so the stack runs
a small reverse proxy instead (`basic_auth_proxy.py`): what clients see is a registry behind
basic auth, as a gateway in front of a registry gives them.

The credentials below are local development credentials (like Azurite's published key), not
secrets; tests still hand them to icekeeper through `${env:...}` references.
"""

from __future__ import annotations

import datetime
import ipaddress
import sys
import urllib.request
from base64 import b64encode
from dataclasses import dataclass
from pathlib import Path

from icekeeper.common.artifacts import Progress
from icekeeper.localstack.services import KafkaService, LaunchSpec, Service, http_status

KAFKA_SASL_USER = "icekeeper"
KAFKA_SASL_PASSWORD = "icekeeper-local-scram"
_BROKER_SASL_USER = "broker"
_BROKER_SASL_PASSWORD = "broker-local-scram"
_KEYSTORE_PASSWORD = "icekeeper-local-keystore"
REGISTRY_AUTH_USER = "icekeeper"
REGISTRY_AUTH_PASSWORD = "icekeeper-local-registry"
SCRAM_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class TlsFiles:
    """A certificate authority and a server certificate it signed."""

    ca_certificate: Path
    """PEM: what clients trust."""
    server_keystore: Path
    """PKCS#12: the server's key and certificate chain."""
    keystore_password: str


def make_certificates(
    folder: Path, host: str, keystore_password: str, ca_name: str = "icekeeper local CA"
) -> TlsFiles:
    """A new self-signed CA, and a certificate for `host` and `localhost` it signed, in `folder`.

    Args:
        folder: where `ca.pem` and `server.p12` are written (replaced if there).
        host: the address clients connect to; an IP address goes in as an IP SAN.
        keystore_password: the password of `server.p12`.
        ca_name: the CA's common name (a test makes a second, unknown CA with another name).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid_from, valid_until = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=30)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca_certificate = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    server_certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(folder / "ca.pem", folder / "server.p12", keystore_password)
    files.ca_certificate.write_bytes(ca_certificate.public_bytes(serialization.Encoding.PEM))
    files.server_keystore.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"server",
            server_key,
            server_certificate,
            [ca_certificate],
            serialization.BestAvailableEncryption(keystore_password.encode()),
        )
    )
    files.server_keystore.chmod(0o600)
    return files


class SaslKafkaService(KafkaService):
    """A KRaft broker taking clients only over SASL_SSL (SCRAM-SHA-512), with a CA made at start."""

    name = "kafka-sasl"

    def address(self) -> str:
        return f"{self.stack.host}:{self.stack.kafka_sasl_port}"

    def ports(self) -> list[int]:
        return [self.stack.kafka_sasl_port, self.stack.kafka_sasl_controller_port]

    @property
    def tls_folder(self) -> Path:
        return self.home / "tls"

    @property
    def ca_certificate(self) -> Path:
        """The PEM file clients trust (replaced at every start)."""
        return self.tls_folder / "ca.pem"

    def prepare(self, progress: Progress) -> LaunchSpec:
        progress(f"making a CA and a certificate for {self.name}")
        make_certificates(self.tls_folder, self.stack.host, _KEYSTORE_PASSWORD)
        return super().prepare(progress)

    def _format_options(self) -> list[str]:
        # SCRAM credentials live in the cluster metadata: format writes them before the first start.
        return [
            option
            for user, password in (
                (KAFKA_SASL_USER, KAFKA_SASL_PASSWORD),
                (_BROKER_SASL_USER, _BROKER_SASL_PASSWORD),
            )
            for option in ("--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]")
        ]

    def _listener_properties(self) -> dict[str, str]:
        host, port, controller = (
            self.stack.host,
            self.stack.kafka_sasl_port,
            self.stack.kafka_sasl_controller_port,
        )
        mechanism = SCRAM_MECHANISM.lower()
        return {
            "controller.quorum.voters": f"1@{host}:{controller}",
            "listeners": f"SASL_SSL://{host}:{port},CONTROLLER://{host}:{controller}",
            "advertised.listeners": f"SASL_SSL://{host}:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            # The broker's own login, for connections it makes to its listener.
            f"listener.name.sasl_ssl.{mechanism}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{_BROKER_SASL_USER}" password="{_BROKER_SASL_PASSWORD}";'
            ),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.tls_folder / "server.p12"),
            "ssl.keystore.password": _KEYSTORE_PASSWORD,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_certificate),
        }

    def client_config(self) -> dict[str, str]:
        return {
            "bootstrap.servers": self.address(),
            "security.protocol": "sasl_ssl",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": KAFKA_SASL_USER,
            "sasl.password": KAFKA_SASL_PASSWORD,
            "ssl.ca.location": str(self.ca_certificate),
        }


class RegistryAuthService(Service):
    """A basic-auth reverse proxy in front of the stack's registry (see the module docstring)."""

    name = "registry-auth"
    needs = ("registry",)

    def address(self) -> str:
        return f"http://{self.stack.host}:{self.stack.registry_auth_port}/apis/ccompat/v7"

    def ports(self) -> list[int]:
        return [self.stack.registry_auth_port]

    @property
    def credentials_file(self) -> Path:
        return self.home / "credentials"

    def prepare(self, progress: Progress) -> LaunchSpec:
        self.home.mkdir(parents=True, exist_ok=True)
        # A file, not the command line: the pid file and `ps` show commands.
        self.credentials_file.write_text(
            f"{REGISTRY_AUTH_USER}:{REGISTRY_AUTH_PASSWORD}\n", encoding="utf-8"
        )
        self.credentials_file.chmod(0o600)
        command = [
            sys.executable,
            "-m",
            "icekeeper.localstack.basic_auth_proxy",
            "--listen",
            f"{self.stack.host}:{self.stack.registry_auth_port}",
            "--upstream",
            f"http://{self.stack.host}:{self.stack.registry_port}",
            "--credentials",
            str(self.credentials_file),
        ]
        return LaunchSpec(command=command, cwd=self.home)

    def healthy(self) -> bool:
        if http_status(f"{self.address()}/subjects") != 401:
            return False
        token = b64encode(f"{REGISTRY_AUTH_USER}:{REGISTRY_AUTH_PASSWORD}".encode()).decode()
        request = urllib.request.Request(
            f"{self.address()}/subjects", headers={"Authorization": f"Basic {token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False
