"""What each Kafka and schema registry client of a source is given to connect: one translation.

icekeeper talks to a source's Kafka through two client libraries that spell the same settings
differently: Spark's Kafka source and sink run the Java client (`sasl.jaas.config`,
`ssl.truststore.*`), the admin, status, replay and tool clients run librdkafka (`sasl.username`,
`ssl.ca.location`). Both are derived here from the source's one `security` section, so a secured
cluster is configured once and no client is left connecting in plaintext. The schema registry
client gets its basic-auth credentials and CA the same way.

Secrets leave the config only through these functions, into client configs that are never
logged whole (Spark redacts `sasl.jaas.config`; the Java client prints passwords as `[hidden]`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata
from confluent_kafka.schema_registry import SchemaRegistryClient

from icekeeper.common.config.model import KafkaSecurity, KafkaSource
from icekeeper.common.config.secrets import mask_text

Cluster = KafkaSource | str
"""A source, or the bare bootstrap servers of a plaintext cluster (the local stack, tests)."""

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def librdkafka_config(
    cluster: Cluster, settings: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A confluent-kafka (librdkafka) client config for `cluster`, plus the client's own `settings`.

    Args:
        cluster: the source (its bootstrap servers and `security`), or plaintext bootstrap servers.
        settings: the client's own properties (`group.id`, `acks`, ...).
    """
    own = dict(settings or {})
    if isinstance(cluster, str):
        return {"bootstrap.servers": cluster, **own}
    security = cluster.security
    config: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "security.protocol": security.protocol.lower(),
    }
    if security.sasl:
        config["sasl.mechanism"] = security.sasl_mechanism
        config["sasl.username"] = security.sasl_username
        config["sasl.password"] = _password(security)
    if security.tls:
        if security.ssl_ca_location:
            config["ssl.ca.location"] = security.ssl_ca_location
        config["ssl.endpoint.identification.algorithm"] = (
            "https" if security.ssl_check_hostname else "none"
        )
    return {**config, **own}


def java_client_properties(cluster: Cluster) -> dict[str, str]:
    """The Java Kafka client's properties for `cluster` (what Spark passes on as `kafka.<key>`)."""
    if isinstance(cluster, str):
        return {"bootstrap.servers": cluster}
    security = cluster.security
    properties = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "security.protocol": security.protocol,
    }
    if security.sasl:
        properties["sasl.mechanism"] = security.sasl_mechanism
        properties["sasl.jaas.config"] = (
            f"{_LOGIN_MODULES[security.sasl_mechanism]} required "
            f"username={_jaas_quoted(security.sasl_username or '')} "
            f"password={_jaas_quoted(_password(security))};"
        )
    if security.tls:
        if security.ssl_ca_location:
            # PEM trust stores need no keytool step (Kafka clients 2.7+, KIP-651).
            properties["ssl.truststore.type"] = "PEM"
            properties["ssl.truststore.location"] = security.ssl_ca_location
        properties["ssl.endpoint.identification.algorithm"] = (
            "https" if security.ssl_check_hostname else ""
        )
    return properties


def spark_kafka_options(cluster: Cluster) -> dict[str, str]:
    """`java_client_properties` as options of Spark's Kafka source and sink (`kafka.` prefix)."""
    return {f"kafka.{key}": value for key, value in java_client_properties(cluster).items()}


def registry_client_config(source: KafkaSource) -> dict[str, Any]:
    """The confluent-kafka `SchemaRegistryClient` config of a source's registry."""
    config: dict[str, Any] = {
        "url": source.schema_registry_url,
        # httpx's timeout for each request; the client's default is none at all.
        "timeout": source.schema_registry_timeout,
    }
    if source.schema_registry_username and source.schema_registry_password:
        config["basic.auth.user.info"] = (
            f"{source.schema_registry_username}:"
            f"{source.schema_registry_password.get_secret_value()}"
        )
    if source.schema_registry_ca_location:
        config["ssl.ca.location"] = source.schema_registry_ca_location
    return config


def registry_client(source: KafkaSource) -> SchemaRegistryClient:
    """A schema registry client of `source`'s registry, with its credentials."""
    return SchemaRegistryClient(registry_client_config(source))


def connection_environ(source: KafkaSource, index: int = 0) -> dict[str, str]:
    """Environment overrides that connect source `index` of another process's config as `source`.

    Bootstrap servers, the registry and its credentials, and `security` (what `icekeeper chaos`
    hands its writers). Passwords travel as `${env:...}` references to variables set beside the
    overrides, not inside a config value.
    """
    prefix = f"ICEKEEPER__SOURCES__{index}__"
    secret_prefix = f"ICEKEEPER_SOURCE_{index}_"
    security = source.security.model_dump(mode="json", exclude={"sasl_password"})
    environ = {
        f"{prefix}BOOTSTRAP_SERVERS": source.bootstrap_servers,
        f"{prefix}SCHEMA_REGISTRY_URL": source.schema_registry_url,
    }
    if source.security.sasl_password is not None:
        environ[f"{secret_prefix}SASL_PASSWORD"] = _password(source.security)
        security["sasl_password"] = f"${{env:{secret_prefix}SASL_PASSWORD}}"
    # JSON is YAML whose strings stay strings (a password `yes` is not read as true).
    environ[f"{prefix}SECURITY"] = json.dumps(security)
    for key in ("schema_registry_username", "schema_registry_ca_location"):
        if getattr(source, key) is not None:
            environ[prefix + key.upper()] = json.dumps(getattr(source, key))
    if source.schema_registry_password is not None:
        environ[f"{secret_prefix}REGISTRY_PASSWORD"] = (
            source.schema_registry_password.get_secret_value()
        )
        environ[f"{prefix}SCHEMA_REGISTRY_PASSWORD"] = f"${{env:{secret_prefix}REGISTRY_PASSWORD}}"
    return environ


class KafkaAccessDenied(RuntimeError):
    """Kafka refused the client: wrong credentials, or a broker certificate the configured CA
    does not vouch for. Retrying with the same settings cannot help, so callers stop."""


class Refusals:
    """A librdkafka `error_cb` that keeps the errors meaning the cluster refused this client.

    librdkafka retries a refused connection silently and only says so through `error_cb`; a
    metadata request meanwhile fails with an uninformative "broker transport failure".
    """

    # librdkafka's local error codes are public, spelt with a leading underscore.
    _CODES = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})  # noqa: SLF001

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, error: KafkaError) -> None:
        if error.code() in self._CODES:
            self.seen.append(error.str())


def cluster_metadata(
    admin: AdminClient, cluster: Cluster, refusals: Refusals, timeout_s: float = 10.0
) -> ClusterMetadata:
    """`admin.list_topics()`, or `KafkaAccessDenied` as soon as the cluster refuses the client.

    Args:
        admin: a client created with `refusals` as its `error_cb`.
        cluster: what `admin` connects to (named in the error).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return admin.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except KafkaException:
            admin.poll(0)  # serves error_cb
            if refusals.seen:
                raise KafkaAccessDenied(_refusal_message(cluster, refusals.seen[-1])) from None
            if time.monotonic() >= deadline:
                raise


def _refusal_message(cluster: Cluster, error: str) -> str:
    if isinstance(cluster, str):
        where, settings = cluster, "the client's security settings"
    else:
        where = cluster.bootstrap_servers
        settings = (
            f"sources[{cluster.name}].security (protocol {cluster.security.protocol}, "
            "sasl_username/sasl_password, ssl_ca_location)"
        )
    return mask_text(
        f"Kafka at {where} refused the connection: {error}. Check {settings}; retrying with "
        "the same settings cannot help. See docs/operations.md, 'Secured clusters'."
    )


def _password(security: KafkaSecurity) -> str:
    return security.sasl_password.get_secret_value() if security.sasl_password else ""


def _jaas_quoted(value: str) -> str:
    # Kafka parses JAAS options with a StreamTokenizer: a quoted value takes \\ and \" escapes.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
