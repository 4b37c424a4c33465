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

from icekeeper.common.config.loader import validate_development_section
from icekeeper.common.config.model import Duration, IcekeeperConfig

SECTION = "stack"


class StackConfig(BaseModel):
    """The local stack `icekeeper stack up` starts: Kafka, schema registry, Azurite, `--with` more.

    `--with mariadb|postgres` adds a database and Debezium in Kafka Connect, `--with kafka-sasl` a
    SASL_SSL broker, `--with registry-auth` the registry behind basic auth; `--with s3` an S3 server
    and `--with rest|nessie|hms|pg-catalog` an Iceberg catalog (each brings `s3`, where its
    tables live).
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
        None,
        description="JDK (21+) for the registry and Nessie; default: the newest JDK found.",
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
    s3_port: int = Field(
        9000,
        description="Port of the stack's S3 server (`stack up --with s3`: s3proxy, files under "
        "the state folder).",
    )
    s3_bucket: str = Field(
        "icekeeper", description="Bucket the S3 server has from its start; catalogs' warehouses."
    )
    s3_access_key_id: str = Field(
        "icekeeper", description="Access key id of the S3 server (loopback only, not a secret)."
    )
    s3_secret_access_key: str = Field(
        "icekeeper-local-secret",
        description="Secret access key of the S3 server (loopback only, not a secret).",
    )
    s3_region: str = Field("us-east-1", description="Region clients of the S3 server sign for.")
    s3proxy_version: str = Field(
        "4.1.0",
        description="s3proxy version (org.gaul:s3proxy, jar `jar-with-dependencies`, from Maven "
        "Central).",
    )
    rest_catalog_port: int = Field(
        8181,
        description="Port of the Iceberg REST catalog (`stack up --with rest`: Iceberg's REST "
        "fixture server, catalog in SQLite under the state folder, warehouse on `s3`).",
    )
    iceberg_version: str = Field(
        "1.11.0",
        description="Iceberg version of the REST catalog server and of the jars Spark clients of "
        "the stack's catalogs add (iceberg-aws-bundle).",
    )
    nessie_port: int = Field(
        19120,
        description="Port of Nessie (`stack up --with nessie`; its Iceberg REST API under "
        "`/iceberg`, warehouse on `s3`; needs Java 21+, see `registry_java_home`).",
    )
    nessie_management_port: int = Field(19121, description="Nessie's (Quarkus) management port.")
    nessie_version: str = Field(
        "0.99.0",
        description="Nessie version (org.projectnessie.nessie:nessie-quarkus, jar `runner`; the "
        "newest runner on Maven Central).",
    )
    hive_metastore_port: int = Field(
        9083,
        description="Thrift port of the Hive Metastore (`stack up --with hms`: standalone, Derby "
        "under the state folder).",
    )
    hive_metastore_version: str = Field(
        "3.1.3",
        description="Hive Metastore version (org.apache.hive:hive-standalone-metastore, tar.gz "
        "`bin`). 4.x answers `Invalid method name: 'get_table'` to every Iceberg client.",
    )
    pg_catalog_port: int = Field(
        5433,
        description="Port of the PostgreSQL that holds a SQL catalog (`stack up --with "
        "pg-catalog`; Debian's `postgresql`, an instance of its own).",
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
