"""The development stack's settings: the `stack:` section of a config file.

Ports and versions of the local services `icekeeper stack up`, `icekeeper demo` and the tests
start. They are for development only, so they live here beside the stack rather than in the
production model (`common/config/model.py`), whose services never read them. A config file
may still carry a `stack:` section, and `ICEKEEPER__STACK__*` environment variables override it
(the tests give each run its own ports that way): the loader keeps the section as written
(`IcekeeperConfig.development`), and `stack_settings` validates it here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from common.config.loader import validate_development_section
from common.config.model import Duration, IcekeeperConfig

SECTION = "stack"


class StackConfig(BaseModel):
    """The local stack `icekeeper stack up` starts: Kafka, schema registry, Azurite, `--with` more.

    `--with mariadb|postgres` adds a database and Debezium in Kafka Connect, `--with kafka-sasl` a
    SASL_SSL broker, `--with registry-auth` the registry behind basic auth.
    """

    model_config = ConfigDict(extra="forbid", validate_default=True)

    host: str = Field("127.0.0.1", description="Address every local service binds to.")
    kafka_port: int = Field(9092, description="Kafka broker port.")
    kafka_controller_port: int = Field(9093, description="KRaft controller port.")
    registry_port: int = Field(
        8081, description="Apicurio Registry HTTP port (Confluent API under `/apis/ccompat/v7`)."
    )
    registry_management_port: int = Field(9001, description="Apicurio (Quarkus) management port.")
    kafka_sasl_port: int = Field(
        9094,
        description="SASL_SSL (SCRAM-SHA-512) port of the second, secured broker that "
        "`stack up --with kafka-sasl` starts (certificates made at start).",
    )
    kafka_sasl_controller_port: int = Field(
        9095, description="KRaft controller port of the secured broker."
    )
    registry_auth_port: int = Field(
        8082,
        description="Port of the basic-auth proxy in front of the registry "
        "(`stack up --with registry-auth`).",
    )
    azurite_queue_port: int = Field(10001, description="Azurite queue port.")
    azurite_blob_port: int = Field(10000, description="Azurite blob port.")
    kafka_version: str = Field(
        "4.3.1", description="Apache Kafka version (org.apache.kafka:kafka_2.13 on Maven Central)."
    )
    registry_version: str = Field(
        "3.3.3",
        description="Apicurio Registry version (io.apicurio:apicurio-registry-app, tar.gz `all`).",
    )
    azurite_version: str = Field("3.37.0", description="Azurite version from npm.")
    registry_java_home: str | None = Field(
        None, description="JDK (21+) for the registry; default: the newest JDK found."
    )
    mariadb_port: int = Field(
        3306,
        description="Port of the stack's MariaDB (`stack up --with mariadb`; Debian's "
        "`mariadb-server`, binlog in ROW format).",
    )
    postgres_port: int = Field(
        5432,
        description="Port of the stack's PostgreSQL (`stack up --with postgres`; Debian's "
        "`postgresql`, `wal_level=logical`).",
    )
    connect_port: int = Field(
        8083,
        description="Kafka Connect REST port (started with `--with mariadb`, `--with postgres` "
        "or `--with connect`); Kafka Connect itself is `kafka_version`.",
    )
    debezium_version: str = Field(
        "3.5.0.Final",
        description="Debezium connectors for Kafka Connect "
        "(io.debezium:debezium-connector-mariadb and -postgres, tar.gz `plugin`, from Maven "
        "Central).",
    )
    apicurio_converter_version: str = Field(
        "2.6.13.Final",
        description="Apicurio's Kafka Connect converters "
        "(io.apicurio:apicurio-registry-utils-converter), which write Avro in Confluent framing "
        "through the stack's registry.",
    )
    start_timeout: Duration = Field(
        120.0, description="How long `stack up` waits for services to become healthy."
    )


def stack_settings(config: IcekeeperConfig) -> StackConfig:
    """The `stack:` section of the file and environment `config` was loaded from (defaults when
    it has none).

    Raises:
        ConfigError: naming the file and the `stack.` key, for a value that does not validate.
    """
    return validate_development_section(config.development, SECTION, StackConfig)
