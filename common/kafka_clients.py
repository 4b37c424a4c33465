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

from collections.abc import Mapping
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient

from common.config.model import KafkaSecurity, KafkaSource

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
    config: dict[str, Any] = {"url": source.schema_registry_url}
    if source.schema_registry_username and source.schema_registry_password:
        config["basic.auth.credentials.source"] = "USER_INFO"
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


def _password(security: KafkaSecurity) -> str:
    return security.sasl_password.get_secret_value() if security.sasl_password else ""


def _jaas_quoted(value: str) -> str:
    # Kafka parses JAAS options with a StreamTokenizer: a quoted value takes \\ and \" escapes.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
