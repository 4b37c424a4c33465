"""The one typed model of an icekeeper config file.

Every key a user can set lives here, with its default and a description; `docs/configuration.md`
is generated from these descriptions (`icekeeper config docs`), so this module is the single
place where a key is documented. Unknown keys are errors (``extra="forbid"``) because a
misspelt key that silently falls back to its default is the most common config bug.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)

from icekeeper.common.config.renames import move_renamed_keys
from icekeeper.common.config.secrets import mask_field
from icekeeper.common.source_formats import SOURCE_FORMATS, formats_description

_DURATION_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration_s(value: object) -> float:
    """Turn ``"500ms"``, ``"10m"``, ``"7d"`` or a bare number of seconds into seconds."""
    if isinstance(value, bool):
        raise ValueError(
            "a duration must be a number of seconds or a string like '10s', '5m', '7d'"
        )
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION_PATTERN.match(str(value))
        if not match:
            raise ValueError(
                f"{value!r} is not a duration: use seconds or a string like '500ms', '10s', '5m', "
                "'2h', '7d'"
            )
        seconds = float(match.group(1)) * _DURATION_UNITS_S[match.group(2) or "s"]
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, populate_by_name=True)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # A config printed or logged whole (`repr`, `str`, an f-string) shows no secret.
        for name, value in super().__repr_args__():
            yield name, mask_field(value)


Duration = Annotated[float, BeforeValidator(parse_duration_s)]
"""Seconds; config files may write ``"500ms"``,
``"10s"``, ``"5m"``, ``"2h"``, ``"7d"`` or a number."""


SourceFormat = Literal[tuple(SOURCE_FORMATS)]  # type: ignore[valid-type]
"""A registered source format's name (`common/source_formats.py`)."""


def _lower_case(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


LogLevel = Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower_case)]
"""icekeeper's log levels (common/logs.py `LOG_LEVELS`), in any case."""
SparkLogLevel = Annotated[Literal["debug", "info", "warn", "error"], BeforeValidator(_lower_case)]
"""log4j's level names for Spark's own logs, in any case."""


class KafkaSecurity(_Model):
    """How every Kafka client of a source authenticates and checks the brokers it talks to.

    One set of settings for all of them: Spark's Kafka source and the dead-letter sink (Java
    client properties) and the admin, status and tool clients (librdkafka) get it translated by
    `common/kafka_clients.py`, so a secured cluster is configured once.
    """

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT",
        description="Kafka `security.protocol`: `SASL_SSL` for SASL over TLS, `SSL` for TLS alone.",
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "SCRAM-SHA-512", description="SASL mechanism (`SASL_SSL`, `SASL_PLAINTEXT`)."
    )
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(
        None,
        description="SASL password; a secret: write `${env:NAME}` or `${file:/path}`, not the "
        "password itself.",
    )
    ssl_ca_location: str | None = Field(
        None,
        description="PEM file of the CA certificate(s) that signed the brokers' certificates (a "
        "private or self-signed CA); default: the system's trusted CAs.",
    )
    ssl_check_hostname: bool = Field(
        True,
        description="Check that a broker's certificate names the host connected to (Kafka's "
        "`ssl.endpoint.identification.algorithm=https`).",
    )

    @model_validator(mode="after")
    def _sasl_has_credentials(self) -> KafkaSecurity:
        if self.protocol.startswith("SASL_") and not (self.sasl_username and self.sasl_password):
            raise ValueError(f"protocol {self.protocol} needs sasl_username and sasl_password")
        return self

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")


class KafkaSource(_Model):
    """A Kafka cluster and the topics icekeeper reads change data from."""

    name: str = Field("default", description="Name that tables use to refer to this source.")
    bootstrap_servers: str = Field(
        "127.0.0.1:9092",
        description="Kafka bootstrap servers (seed 000: `kafka.bootstrap.servers`).",
    )
    schema_registry_url: str = Field(
        "http://127.0.0.1:8081/apis/ccompat/v7",
        description="Confluent-compatible schema registry URL (seed 000: "
        "`kafka.schema.registry.url`). For Apicurio include `/apis/ccompat/v7`. Basic auth as "
        "user-info, with the password referenced: `https://user:${env:REGISTRY_PASSWORD}@host/...` "
        "(see docs/operations.md, Secrets).",
    )
    schema_registry_username: str | None = Field(
        None, description="Schema registry basic-auth user (instead of user-info in the URL)."
    )
    schema_registry_password: SecretStr | None = Field(
        None,
        description="Schema registry basic-auth password; a secret: `${env:NAME}` or "
        "`${file:/path}`.",
    )
    schema_registry_ca_location: str | None = Field(
        None,
        description="PEM file of the CA that signed an `https://` registry's certificate; "
        "default: the system's trusted CAs.",
    )
    schema_registry_timeout: Duration = Field(
        30.0,
        gt=0,
        description="How long one request to the schema registry may take before the client gives "
        "up (and retries, then pauses the writer: an outage, never poison). The registry client "
        "would otherwise wait for ever on a registry that accepts connections and never answers.",
    )
    security: KafkaSecurity = Field(
        default_factory=KafkaSecurity,
        description="Authentication and TLS of every Kafka client of this source.",
    )
    topics: list[str] = Field(
        default_factory=list,
        description="Topics to read (seed 000: `kafka.consumer.topic`, comma separated).",
    )
    topic_pattern: str | None = Field(
        None, description="Java regex of topics to read, instead of `topics`."
    )
    consumer_group: str = Field(
        "icekeeper",
        description="Consumer group whose offsets writers commit so lag shows in Kafka tools "
        "(seed 000: `kafka.consumer.group.id`).",
    )
    format: SourceFormat = Field(
        "avro-confluent",
        description=f"Message format: {formats_description()}.",
    )
    starting_offsets: Literal["earliest", "latest"] = Field(
        "earliest",
        description="Where a topic-partition starts when the table has nothing committed for it.",
    )
    max_offsets_per_trigger: int | None = Field(
        200_000,
        ge=1,
        description="Upper bound on records per writer batch (Spark `maxOffsetsPerTrigger`).",
    )
    max_rate_per_partition: int | None = Field(
        None,
        ge=1,
        description="Records per second per partition; caps a batch at rate x trigger interval x "
        "partitions (seed 000: `spark.streaming.kafka.maxRatePerPartition`).",
    )
    dead_letter_topic: str = Field(
        "icekeeper.dead-letter",
        description="Topic that receives records which cannot be decoded or routed, with the "
        "reason in headers.",
    )
    tombstones: Literal["skip", "dead-letter"] = Field(
        "skip",
        description="Kafka tombstones (null value, Debezium's follow-up to a delete): `skip` "
        "counts and drops them; `dead-letter` sends them to the dead-letter topic.",
    )
    offset_gaps: bool = Field(
        False,
        description="Allow offsets with no record (compacted or transactional topics). Off: a "
        "batch that reads fewer records than its offset span fails and is retried, instead of "
        "silently skipping records Kafka did not return.",
    )
    table_template: str | None = Field(
        None,
        description="Route records no table claims to a table named by this template, e.g. "
        "`cdc.{db}_{table}`; fields: `{topic}`, `{server}`, `{db}`, `{table}` (Debezium "
        "`source.name`, `source.db`, `source.table`).",
    )
    consumer_properties: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Kafka consumer properties (seed 000: `kafka.consumer.*`, e.g. "
        "`isolation.level`), in the Java client's names: Spark's Kafka source takes them as they "
        "are; the arrow engine passes those librdkafka knows (a few renamed, assignment-only ones "
        "dropped) and hands a batch with others to `spark-sql`. Authentication and TLS go in "
        "`security`, which every Kafka client of the source gets; secrets here as references too.",
    )
    on_topic_reset: Literal["stop", "restart"] = Field(
        "stop",
        description="A partition whose end offset is below the next offset a table needs (the "
        "topic was deleted and recreated): `stop` stops the writer with an error; `restart` starts "
        "the tables over from the new topic's first offset, and the bookkeeper replaces their "
        "committed offsets of the partition (docs/operations.md).",
    )
    commit_timeout: Duration = Field(
        10.0,
        gt=0,
        description="How long a writer waits for Kafka to take the consumer group's offsets after "
        "a batch (the admin request's timeout); past it the writer logs a warning and goes on: "
        "the group's offsets show lag in Kafka tools, tables keep their own (seed 000: "
        "`kafka.consumer.commit.timeout.millis`).",
    )

    @model_validator(mode="after")
    def _one_topic_selector(self) -> KafkaSource:
        if self.topics and self.topic_pattern:
            raise ValueError("set either `topics` or `topic_pattern`, not both")
        return self

    @model_validator(mode="after")
    def _one_registry_credential(self) -> KafkaSource:
        if (self.schema_registry_username is None) != (self.schema_registry_password is None):
            raise ValueError("set both schema_registry_username and schema_registry_password")
        if self.schema_registry_username and urlsplit(self.schema_registry_url).username:
            raise ValueError(
                "schema registry credentials given twice: in schema_registry_url and in "
                "schema_registry_username/password"
            )
        return self


class TableSpec(_Model):
    """One Iceberg table and which records land in it."""

    identifier: str = Field(
        ...,
        description="`namespace.table` in the catalog (seed 000: `iceberg.table.name`; a leading "
        "Spark catalog name is dropped).",
    )
    source: str = Field("default", description="Name of the source this table reads from.")
    topics: list[str] = Field(
        default_factory=list, description="Route every record of these topics to this table."
    )
    source_db: str | None = Field(
        None,
        description="Route Debezium records whose `source.db` equals this (with `source_table`).",
    )
    source_table: str | None = Field(
        None, description="Route Debezium records whose `source.table` equals this."
    )
    primary_key: list[str] = Field(
        default_factory=list,
        description="Key columns (seed 000: `iceberg.table.primaryKey`); becomes the table's "
        "identifier fields.",
    )
    mode: Literal["changelog", "upsert"] | None = Field(
        None,
        description="`upsert`: the table mirrors the source table, one live row per primary key "
        "(position deletes through the bookkeeper's key index). `changelog`: every change is a "
        "row. Default: `upsert` when `primary_key` is set (seed 000's primaryKey tables answer one "
        "row per key), else `changelog`.",
    )
    delete_mode: Literal["hard", "soft"] = Field(
        "hard",
        description="Upsert tables: `hard` removes a deleted key's row; `soft` keeps its last row "
        "with the delete operation in the op column (`<prefix>op` = 'd').",
    )
    partition_by: list[str] = Field(
        default_factory=list,
        description="Partition spec: `col`, `year(col)`, `month(col)`, `day(col)`, `hour(col)`, "
        "`bucket(N, col)`, `truncate(W, col)` (seed 000: `iceberg.table.partitionBy`).",
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="Iceberg table properties (seed 000: `iceberg.table.properties`). "
        "`format-version`: 2 (the default) or, for changelog tables, 1; the bookkeeper does not "
        "write format-version 3 metadata (so no deletion vectors: upsert tables get "
        "position-delete files).",
    )
    comment: str | None = Field(
        None, description="Table comment (seed 000: `iceberg.table.comment`)."
    )
    location: str | None = Field(
        None,
        description="Table location; default: under the catalog warehouse (seed 000: "
        "`iceberg.table.location`).",
    )

    @field_validator("identifier")
    @classmethod
    def _qualified(cls, identifier: str) -> str:
        parts = identifier.split(".")
        if len(parts) < 2 or not all(parts):
            raise ValueError(f"{identifier!r} must be `namespace.table`")
        return identifier

    @model_validator(mode="after")
    def _upsert_needs_a_key(self) -> TableSpec:
        if self.mode == "upsert" and not self.primary_key:
            raise ValueError(f"{self.identifier}: mode upsert needs primary_key")
        return self

    @model_validator(mode="after")
    def _a_format_version_the_bookkeeper_writes(self) -> TableSpec:
        # The bookkeeper commits through pyiceberg 0.12's snapshot producer and its own v2 manifest
        # encoder; pyiceberg writes no v3 manifests, manifest lists or row lineage, so a v3 table
        # would fail at its first commit. Say so now instead.
        version = self.properties.get("format-version", "2")
        if version not in ("1", "2"):
            raise ValueError(
                f"{self.identifier}: format-version {version} is not supported; the bookkeeper "
                "writes format-version 2 (upsert tables: position-delete files, which every "
                "engine reads; deletion vectors need format-version 3)"
            )
        if version == "1" and self.upsert:
            raise ValueError(
                f"{self.identifier}: an upsert table needs format-version 2 (row-level deletes); "
                "format-version 1 has none"
            )
        return self

    @property
    def upsert(self) -> bool:
        """True when the table mirrors its source (see `mode`)."""
        return self.mode == "upsert" or (self.mode is None and bool(self.primary_key))

    @field_validator("partition_by")
    @classmethod
    def _partition_terms(cls, terms: list[str]) -> list[str]:
        for term in terms:
            if not _PARTITION_TERM.match(term):
                raise ValueError(
                    f"{term!r} is not a partition term: use col, day(col), hour(col), bucket(N, "
                    "col), truncate(W, col)"
                )
        return terms


_PARTITION_TERM = re.compile(
    r"^\s*(?:[A-Za-z_][\w.]*|(?:year|month|day|hour|years|months|days|hours)\(\s*[A-Za-z_][\w.]*\s*\)"
    r"|(?:bucket|truncate)\(\s*\d+\s*,\s*[A-Za-z_][\w.]*\s*\))\s*$"
)


class MetadataGroup(_Model):
    """A group of metadata columns copied from the envelope, each named prefix + field."""

    columns: list[str] = Field(
        default_factory=list, description="Fields to copy; empty turns the group off."
    )
    prefix: str = Field("", description="Prefix of the column names.")


class MetadataColumns(_Model):
    """Metadata columns added to every row, as in seed 000 (`record.metadata.*`)."""

    source: MetadataGroup = Field(
        default_factory=lambda: MetadataGroup(
            columns=["name", "db", "table", "ts_ms", "server_id", "file", "pos"], prefix="_src_"
        ),
        description="Debezium `source` fields (seed 000: `record.metadata.source.columns` / "
        "`.prefix`). The operation (`<prefix>op`) and the envelope's `ts_ms` (`<prefix>ts_ms_r`) "
        "are always added.",
    )
    transaction: MetadataGroup = Field(
        default_factory=lambda: MetadataGroup(
            columns=["id", "total_order", "data_collection_order"], prefix="_tsc_"
        ),
        description="Debezium `transaction` fields (seed 000: "
        "`record.metadata.transaction.columns` / `.prefix`).",
    )
    kafka: MetadataGroup = Field(
        default_factory=lambda: MetadataGroup(
            columns=["topic", "partition", "offset", "timestamp"], prefix="_kfk_"
        ),
        description="Kafka record fields: topic, partition, offset, timestamp (seed 000: "
        "`record.metadata.kafka.columns` / `.prefix`).",
    )

    @field_validator("kafka")
    @classmethod
    def _known_kafka_fields(cls, group: MetadataGroup) -> MetadataGroup:
        unknown = set(group.columns) - {"topic", "partition", "offset", "timestamp", "key"}
        if unknown:
            raise ValueError(
                f"unknown Kafka metadata fields {sorted(unknown)}: use topic, partition, offset, "
                "timestamp, key"
            )
        return group


class TxLogTransport(_Model):
    """Monikers as files in a transaction-log folder (local,
    abfs://, s3://: anything pyarrow/fsspec opens)."""

    kind: Literal["txlog"] = "txlog"
    uri: str = Field(
        "{state_dir}/txlog",
        description="Folder that holds pending monikers: a local or mounted folder, `s3://` or "
        "`abfss://`.",
    )
    dead_letter_uri: str = Field(
        "{state_dir}/dead-letter/monikers",
        description="Folder for monikers set aside (unreadable, quarantined), with their "
        "reasons: `icekeeper dead-letters` lists and replays them, the reaper spares their files.",
    )


MAX_INLINE_MONIKER_BYTES = 48 * 1024
"""Largest moniker an Azure queue message carries inline: below the 64 KiB message limit with room
for the XML escaping the SDK applies."""


class AzureQueueTransport(_Model):
    """Monikers as Azure Storage Queue messages (Azurite locally)."""

    kind: Literal["azure-queue"] = "azure-queue"
    connection_string: SecretStr = Field(
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
        "QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;",
        description="Storage account connection string (default: Azurite's well-known dev "
        "account); a secret: write `${env:NAME}` or `${file:/path}` rather than the string itself.",
    )
    queue_name: str = Field("icekeeper-monikers", description="Queue that carries monikers.")
    dead_letter_queue_name: str = Field(
        "icekeeper-monikers-dead-letter",
        description="Queue that gets a message (reason, source) for every dead-lettered moniker, "
        "for alerts.",
    )
    dead_letter_uri: str = Field(
        "{state_dir}/dead-letter/monikers",
        description="Folder that keeps dead-lettered monikers whole, with their reasons: "
        "`icekeeper dead-letters` lists and replays them, the reaper spares their files.",
    )
    api_version: str | None = Field(
        "2026-06-06",
        description="Storage API version the SDK sends; Azurite 3.37 rejects the SDK's newest.",
    )
    journal_uri: str = Field(
        "{state_dir}/moniker-journal",
        description="Folder that keeps a copy of every pending moniker: writers resume from it, "
        "the reaper spares its files, and a message too large for the queue points to it.",
    )
    max_inline_bytes: int = Field(
        MAX_INLINE_MONIKER_BYTES,
        ge=0,
        le=MAX_INLINE_MONIKER_BYTES,
        description="A writer sends a moniker whose encoded size passes this as a pointer to its "
        "journal copy instead of inside the message. The default keeps below the queue's 64 KiB "
        "message limit after the SDK's XML escaping; lower values send more monikers as pointers "
        "(`icekeeper chaos` sends one writer's monikers all so, with 0).",
    )
    visibility_timeout: Duration = Field(
        60.0,
        ge=1,
        description="How long a message the bookkeeper received stays hidden from its next "
        "receives (whole seconds). A moniker that cannot commit yet (its predecessor is not "
        "committed, or the cycle is full: `bookkeeper.max_files_per_commit`) comes back only "
        "after this, so a backlog larger than one cycle's budget commits about one budget per "
        "timeout.",
    )


Transport = Annotated[TxLogTransport | AzureQueueTransport, Field(discriminator="kind")]


class CatalogConfig(_Model):
    """The Iceberg catalog, as pyiceberg catalog properties."""

    name: str = Field(
        "icekeeper",
        description="Catalog name (pyiceberg's catalog name; Spark registers it under the same "
        "name).",
    )
    properties: dict[str, str] = Field(
        default_factory=lambda: {
            "type": "sql",
            "uri": "sqlite:///{state_dir}/catalog.db",
            "warehouse": "file://{state_dir}/warehouse",
        },
        description="pyiceberg catalog properties; default: a SQLite catalog and a local warehouse "
        "under the state folder. Credentials (`credential`, `token`, `s3.secret-access-key`, a "
        "password in `uri`) as `${env:NAME}` or `${file:/path}`. Their storage properties "
        "(`s3.endpoint`, `s3.access-key-id`, `s3.secret-access-key`, `s3.region`, "
        "`s3.path-style-access`; `adls.account-name`, `adls.account-key`, `adls.sas-token`, "
        "`adls.connection-string`) also open every other `s3://` or "
        "`abfss://<container>@<account>.dfs.core.windows.net/` URI of this config (monikers, "
        "leases, reports, dead letters), and reach Spark (S3FileIO / ADLSFileIO) and DuckDB. A "
        "REST catalog's client properties reach Spark's catalog as well, under Iceberg Java's "
        "names: `credential`, `token`, `scope`, `oauth2-server-uri`, `audience`, `resource`, "
        "`token-*`, `header.<Name>`, `prefix`, `warehouse`, `rest.*`; `rest.sigv4-enabled` with "
        "`client.*` as `rest.auth.type: sigv4` with `rest.access-key-id`, ... "
        "(docs/operations.md).",
    )
    request_timeout: Duration = Field(
        60.0,
        gt=0,
        description="How long a call to a shared catalog may wait before it fails (pyiceberg "
        "itself waits forever). REST: to connect, and for each part of the server's answer "
        "(Spark's client: `rest.client.connection-timeout-ms`, `rest.client.socket-timeout-ms`, "
        "unless the properties set them). Hive "
        "Metastore: to connect, and for each read and write of its Thrift connection. "
        "PostgreSQL (`postgresql://`, `postgresql+psycopg://` URLs): the server cancels a "
        "statement running longer (`statement_timeout`) and ends a session idle longer, in a "
        "transaction or not; the client gives up on a silent server or network (connect timeout, "
        "TCP keepalives, `tcp_user_timeout`); Spark's JDBC catalog gets PgJDBC's "
        "`connectTimeout`, `loginTimeout`, `socketTimeout`, `tcpKeepAlive` and the same "
        "`statement_timeout` and `idle_in_transaction_session_timeout`; parameters the URL sets "
        "itself are kept "
        "(docs/operations.md). A commit that times out is of unknown outcome: the bookkeeper reads "
        "the table back to settle it.",
    )


class WriterConfig(_Model):
    """The Spark writer job."""

    writer_id: str = Field(
        "writer-1",
        description="Stable id of this writer; part of every moniker id, so keep it across "
        "restarts.",
    )
    app_name: str = Field(
        "icekeeper-writer", description="Spark application name (seed 000: `spark.app.name`)."
    )
    trigger_interval: Duration = Field(1.0, description="Time between batches.")
    target_file_size_bytes: int = Field(
        128 * 1024 * 1024, ge=1024, description="Target size of a data file."
    )
    max_pending_bytes: int = Field(
        8 * 1024**3,
        ge=1,
        description="Back-pressure: a writer reads nothing from Kafka while the files of its "
        "tables' monikers waiting for the bookkeeper add up to more than this (the bookkeeper "
        "is behind; reading more would only pile up files). Was `bookkeeper.max_pending_bytes`.",
    )
    instance_index: int = Field(
        0,
        ge=0,
        description="This writer's share of each topic: partitions p with p % instance_count == "
        "instance_index.",
    )
    instance_count: int = Field(
        1,
        ge=1,
        description="How many writers share the source topics (each with its own writer_id and "
        "index).",
    )
    checkpoint_uri: str = Field(
        "{state_dir}/writer-checkpoints",
        description="Folder where a writer notes how far it has read each source (advisory; "
        "tables and pending monikers decide).",
    )
    distribution: Literal["none", "rebalance"] = Field(
        "none",
        description="`none`: each Kafka task writes its own files (no shuffle); `rebalance`: "
        "shuffle by partition with Spark's adaptive rebalancing, which splits skewed partitions "
        "across tasks (fewer, larger files per partition).",
    )
    engine: Literal["spark-sql", "arrow"] = Field(
        "arrow",
        description="`arrow` (the default): Spark schedules tasks whose Python body reads its "
        "offsets with confluent-kafka, decodes Avro in bulk (polars), flattens with Arrow and "
        "writes Parquet with pyarrow; no row crosses the JVM (a small batch runs in the writer "
        "itself: `driver_batch_records`). It takes Confluent-framed Avro into changelog and "
        "upsert tables; other batches (JSON sources, collection and map columns, a few "
        "settings), and a batch whose counts do not reconcile with the dead-letter pass, run on "
        "`spark-sql`, logged once per source and kind of reason. `spark-sql`: Spark reads, "
        "decodes (`from_avro`) and writes the rows, for clusters whose executors have no Python "
        "packages.",
    )
    driver_batch_records: int = Field(
        20_000,
        ge=0,
        description="`engine: arrow`: a batch of at most this many records runs its tasks in the "
        "writer's own process (a thread each) instead of as a Spark job, whose fixed cost "
        "(0.2-0.5 s) is ten times the work of a few thousand records; 0: always a Spark job.",
    )
    http_port: int = Field(
        9466,
        ge=0,
        le=65535,
        description="Port of the writer's `/metrics`, `/healthz` (liveness) and `/readyz` "
        "(readiness) while it runs continuously (a one-off run, `--once`, `--max-batches` or "
        "`--until-idle`, serves none); 0: off. Writers sharing a host need a port each.",
    )
    http_host: str = Field(
        "127.0.0.1",
        description="Address the writer's metrics and health endpoints bind to; `0.0.0.0` for "
        "every interface (a Prometheus scraping from another host).",
    )

    @model_validator(mode="after")
    def _index_in_range(self) -> WriterConfig:
        if self.instance_index >= self.instance_count:
            raise ValueError(
                f"instance_index {self.instance_index} must be below instance_count "
                f"{self.instance_count}"
            )
        return self


class BookkeeperConfig(_Model):
    """The committing service."""

    commit_interval: Duration = Field(1.0, description="Time between commit cycles.")
    idle_poll_interval: Duration = Field(
        0.1,
        description="After a cycle that committed nothing, how often to look for new monikers "
        "until the next cycle (one folder listing or queue peek each); one that arrives starts a "
        "cycle at once. 0: look only at cycles.",
    )
    max_files_per_commit: int = Field(
        10_000, ge=1, description="Upper bound on files in one snapshot."
    )
    max_bytes_per_commit: int = Field(
        16 * 1024**3, ge=1, description="Upper bound on bytes in one snapshot."
    )
    footer_workers: int = Field(
        0,
        ge=0,
        description="Processes that read Parquet footers and compute column metrics in parallel "
        "(0: one per core).",
    )
    max_attempts: int = Field(
        5,
        ge=1,
        description="Reads that found a moniker unreadable (bad input, not an outage) before it "
        "goes to the dead-letter place.",
    )
    missing_file_timeout: Duration = Field(
        3600.0,
        gt=0,
        description="How long a file a moniker names may stay missing (storage says it does not "
        "exist) before the moniker is quarantined; until then it stays pending and is retried "
        "every cycle, like a file storage fails to serve (network errors, timeouts, throttling), "
        "which is retried for as long as it takes. The same for the files of a rewrite request "
        "(a compaction or purge of an upsert table): past it the request is set aside, its files "
        "kept. See docs/operations.md.",
    )
    lease_ttl: Duration = Field(
        30.0,
        description="How long a bookkeeper's lease on its group (`group.name`) lasts without "
        "renewal; a standby takes over after it.",
    )
    http_port: int = Field(
        9464,
        ge=0,
        le=65535,
        description="Port of `/metrics`, `/healthz` (liveness), `/readyz` (readiness) and the "
        "group's status page (`/`); 0: off.",
    )
    http_host: str = Field(
        "127.0.0.1",
        description="Address the metrics and health endpoints bind to; `0.0.0.0` for every "
        "interface (a Prometheus scraping from another host).",
    )
    heartbeat_every_empty_cycles: int = Field(
        0, ge=0, description="Commit a watermark-only snapshot every N empty cycles (0: never)."
    )
    commit_report_path: str = Field(
        "{state_dir}/reports/commits.jsonl",
        description="File that receives one JSON line per snapshot (not for the bookkeeper's "
        "purges of mostly-deleted files, `purge_deleted_share`: they add no rows and no "
        "watermark). On `s3://` or `abfss://`, which cannot append, a folder of that name "
        "receives one `<ms>-<id>.jsonl` object per cycle.",
    )
    commit_report_topic: str | None = Field(
        None, description="Kafka topic that also receives the commit reports."
    )
    allow_drop_columns: bool = Field(
        False,
        description="Drop a column from the table once a batch's records for it no longer carry "
        "the column (the source dropped it); when false, the column stays and is null in later "
        "rows. See docs/types.md.",
    )
    keep_snapshots: int = Field(
        20,
        ge=2,
        description="Snapshots always kept in table metadata, whatever their age (Iceberg's "
        "`history.expire.min-snapshots-to-keep`); the bookkeeper expires, as it commits, snapshots "
        "beyond these that are older than `keep_snapshots_for`.",
    )
    keep_snapshots_for: Duration = Field(
        3600.0,
        description="How long the bookkeeper keeps a snapshot (Iceberg's "
        "`history.expire.max-snapshot-age-ms`): a streaming reader (Spark `readStream`, "
        "incremental reads) may fall this far behind and still read every later row once. At one "
        "commit a second, an hour is 3,600 snapshots; commit cost stays flat (bench/results.md). "
        "See docs/operations.md.",
    )
    key_index_save_interval: Duration = Field(
        60.0,
        description="Upsert tables: how often the key index is saved beside the table (and at a "
        "clean stop); a restarted bookkeeper replays only the snapshots committed since.",
    )
    rewrite_poll_interval: Duration = Field(
        5.0,
        gt=0,
        description="Upsert tables: how often the bookkeeper looks for compactions the reaper left "
        "for it to commit (the reaper cannot commit them itself while updates continue).",
    )
    rewrite_failed_polls: int = Field(
        5,
        ge=1,
        description="Upsert tables: polls a rewrite request may fail with an error that is not an "
        "outage (a bug, a request no commit can take) before it is set aside with the reason, its "
        "files kept, for `dead-letters --rewrites`; an outage (storage or the catalog "
        "unreachable, conflicts) keeps it pending however long. Counted by each bookkeeper from "
        "its start.",
    )
    purge_deleted_share: float = Field(
        0.3,
        ge=0,
        le=1,
        description="Upsert tables: after a cycle's commit, the bookkeeper rewrites each data file "
        "of which at least this share of rows is deleted (and that is at most "
        "`purge_max_file_bytes`) as a new file of its live rows, and commits a `replace` snapshot "
        "that swaps them and the delete files that only concern them out, so that readers between "
        "reaper passes do not read and drop the dead rows; a file with no live row just leaves. "
        "Iceberg's `delete-ratio-threshold` default, as `reaper.compact_delete_ratio`. 0: off.",
    )
    purge_max_file_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1,
        description="Upsert tables: largest data file the bookkeeper purges "
        "(`purge_deleted_share`), and the size its new files are cut at; larger files are the "
        "reaper's compaction's.",
    )
    purge_max_bytes_per_cycle: int = Field(
        64 * 1024 * 1024,
        ge=1,
        description="Upsert tables: bytes of data files the bookkeeper reads for purges in one "
        "cycle (about a second of work on one core), so a cycle's latency stays bounded; the most "
        "deleted files go first, the rest wait for a later cycle. A file larger than this is not "
        "purged.",
    )


class ReaperConfig(_Model):
    """Scheduled maintenance (seed 000: `iceberg.maintenance.*`)."""

    enabled: bool = Field(
        True, description="Run maintenance at all (seed 000: `iceberg.maintenance.enabled`)."
    )
    triggering_time: str | None = Field(
        None,
        description="Earliest time of day of the first run, `HH:MM:SS` (seed 000: "
        "`.triggering.time`).",
    )
    execute_interval: Duration = Field(
        3600.0, description="Time between runs (seed 000: `.execute.interval`, milliseconds there)."
    )
    snapshot_expire_time: Duration = Field(
        86400.0,
        description="Expire snapshots older than this (seed 000: `.snapshot.expire.time`, "
        "milliseconds there).",
    )
    retain_last: int = Field(10, ge=1, description="Snapshots always kept, whatever their age.")
    retention: Duration | None = Field(
        None, description="Delete rows older than this by `retention_column` (off when unset)."
    )
    retention_column: str | None = Field(None, description="Time column that retention filters on.")
    compact_filter_column: str | None = Field(
        None,
        description="Time column that selects what to compact (seed 000: "
        "`.compact.filter.column`).",
    )
    compact_day_offset: int = Field(
        0,
        ge=0,
        description="Compact data of the day this many days before yesterday; 0 = yesterday (seed "
        "000: `.compact.day.offset`).",
    )
    compact_target_file_size_bytes: int = Field(
        128 * 1024 * 1024,
        ge=1024,
        description="Target size of compacted files (seed 000: `.compact.target.file.size.bytes`).",
    )
    compact_delete_ratio: float = Field(
        0.3,
        gt=0,
        le=1,
        description="Upsert tables: compaction also rewrites any data file once this share of its "
        "rows is deleted (or that has collected 8 delete files, as other engines' deletes can "
        "leave), dropping the deleted rows and the file's delete files; the bookkeeper commits "
        "such compactions, so they land while updates continue.",
    )
    manifests_file_length: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="Target manifest size when rewriting manifests (seed 000: "
        "`.manifests.file.length`).",
    )
    max_manifests: int = Field(
        100, ge=1, description="Rewrite manifests when a table has more than this many."
    )
    rewrite_wait: Duration = Field(
        300.0,
        description="Upsert tables: how long a compaction waits for the bookkeeper to commit the "
        "files it wrote (the bookkeeper commits them, since it keeps adding deletes to the same "
        "files); after that the pass goes on and the bookkeeper commits them when it can. Only a "
        "running bookkeeper (one holding the group's lease) is waited for: with none, or once its "
        "lease lapses, the pass goes on at once.",
    )
    commit_attempts: int = Field(
        5,
        ge=1,
        description="A maintenance commit (a compaction file group, the manifest rewrite, the "
        "expiry, the retention delete) that lost every one of Iceberg's retries to concurrent "
        "bookkeeper commits is tried again, up to this many times per pass.",
    )
    report_path: str = Field(
        "{state_dir}/reports/reaper.jsonl",
        description="File that receives one JSON line per pass (on `s3://` or `abfss://`, a "
        "folder of one-line objects, as `bookkeeper.commit_report_path`).",
    )
    http_port: int = Field(
        9465,
        ge=0,
        le=65535,
        description="Port of the reaper's `/metrics`, `/healthz` (liveness) and `/readyz` "
        "(readiness) while it runs on a schedule (`--every`, `execute_interval`; a one-off pass "
        "reports to `report_path` only); 0: off.",
    )
    http_host: str = Field(
        "127.0.0.1",
        description="Address the reaper's metrics and health endpoints bind to; `0.0.0.0` for "
        "every interface (a Prometheus scraping from another host).",
    )
    lease_ttl: Duration = Field(
        600.0,
        description="Lease that keeps two reapers of a group apart, renewed between steps; a "
        "killed reaper delays the next pass by at most this long.",
    )

    @field_validator("triggering_time")
    @classmethod
    def _time_of_day(cls, value: str | None) -> str | None:
        if value is not None and not re.match(
            r"^([01]\d|2[0-3]):[0-5]\d(:[0-5]\d)?$", value.strip()
        ):
            raise ValueError(f"{value!r} is not a time of day: use HH:MM:SS")
        return value.strip() if value else value


class SparkConfig(_Model):
    """The Spark session of every Spark job icekeeper runs: the writer's and the reaper's."""

    master: str = Field(
        "local[*]",
        description="Spark master URL, as `spark-submit --master` takes it (seed 000: "
        "`spark.master`); under spark-submit its command line decides. A shared section because "
        "the writer and the reaper run on the same Spark (was `writer.spark_master`).",
    )
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Spark settings, as `spark-submit --conf key=value` takes them (seed "
        "000: any other `spark.*` key), for the writer's and the reaper's sessions (was "
        "`writer.spark_conf`). The settings the writer's output depends on are fixed over them: "
        "`spark.sql.session.timeZone: UTC` and `CORRECTED` (proleptic Gregorian) Parquet write "
        "and Avro read datetime rebase modes.",
    )
    executor_env: str = Field(
        "",
        description="The Python environment the writer's executors run its `arrow` tasks in "
        "(masters other than `local`; `spark-sql` runs none and ships nothing). Empty: the "
        "Python Spark finds there (`PYSPARK_PYTHON`, "
        "else `python3`), which must have `icekeeper[executor]` installed. `packed`: the "
        "writer packs one with venv-pack (as `icekeeper writer --executor-env` does; built once, "
        "cached under `cache_dir/executor-env/`) and ships it with `spark.archives`, so "
        "executors need only Java, Spark and this Python interpreter at the same path. Or the "
        "path or URI of such an archive, shipped as it is. Under spark-submit its flags may do "
        'the same (docs/operations.md, "Writers on a Spark cluster").',
    )
    log_level: SparkLogLevel = Field(
        "error",
        description="Level of Spark's own (log4j) logs in the writer's and the reaper's driver, "
        "from its start: error hides Spark's routine warnings (a loopback hostname, no "
        "native-hadoop library, plans truncated for display); warn or info shows them.",
    )


class GroupConfig(_Model):
    """What the roles serving one set of tables must agree on: leases and the orphan grace."""

    name: str = Field(
        "default",
        description="Name of the group of tables one bookkeeper commits and one reaper "
        "maintains: the bookkeeper holds lease `<name>` and the reaper lease `<name>-reaper` in "
        "`lease_uri`, so a second one of either waits. Not a Kafka consumer group (that is "
        "`sources[].consumer_group`). Was `bookkeeper.group`.",
    )
    lease_uri: str = Field(
        "{state_dir}/bookkeeper-leases",
        description="Folder holding the group's lease files: a local or mounted folder, `s3://` "
        "or `abfss://` (the store's create-if-absent keeps two holders apart); every bookkeeper "
        "and reaper of the group must see the same folder. Was `bookkeeper.lease_uri`.",
    )
    orphan_grace: Duration = Field(
        86400.0,
        description="Files younger than this are never orphans (Iceberg's `remove_orphan_files` "
        "`older_than`): the reaper deletes no unreferenced file this young, and writers rewrite "
        "their claims on the batch folders they are filling every quarter of it (at most 30 s), "
        "so a claim not rewritten within it protects nothing. Shared because writers and "
        "reaper must agree on it. Was `reaper.orphan_grace`.",
    )


DEVELOPMENT_SECTIONS = ("stack",)
"""Top-level sections a config file may hold for the development tools only: `stack`, the local
stack's ports and versions (icekeeper/localstack/settings.py). icekeeper's services never read
them, so this model has no field for them; the loader keeps them as written
(`IcekeeperConfig.development`)."""


@dataclass(frozen=True)
class DevelopmentSections:
    """The development sections of one loaded config, as the file and the environment gave them."""

    source: str = "<embedded defaults>"
    """The file (or `<embedded defaults>`) they came from, for error messages."""
    sections: Mapping[str, Any] = field(default_factory=dict)
    """Section name -> its raw mapping; a section the file does not have is absent."""
    key_names: Mapping[str, str] = field(default_factory=dict)
    """Model key -> the key as the user wrote it (an environment variable), for errors."""


class IcekeeperConfig(_Model):
    """A whole icekeeper config file."""

    state_dir: str = Field(
        ".icekeeper",
        description="Folder for local state: stack data and logs, catalog, warehouse, transaction "
        "log, reports. `{state_dir}` in other values expands to it.",
    )
    cache_dir: str = Field(
        ".cache",
        description="Folder that caches downloads (jars, registry, Azurite); safe to delete.",
    )
    log_level: LogLevel = Field(
        "warning",
        description="icekeeper's own log level (JSON lines on stderr): debug, info, warning or "
        "error. The command line wins (`-v` info, `-vv` debug, `--log-level`); "
        "`ICEKEEPER__LOG_LEVEL` overrides the file, like any key. Progress of long first-run "
        "work (fetching jars) shows at warning too.",
    )
    sources: list[KafkaSource] = Field(
        default_factory=list,
        description="Kafka sources. None by default: the writer stops with an error until one is "
        "listed (the development commands, e.g. `icekeeper demo` and `produce-sample`, use seed "
        "000's on the local stack instead).",
    )
    tables: list[TableSpec] = Field(
        default_factory=list,
        description="Iceberg tables and their routing. None by default: the writer, the "
        "bookkeeper and the reaper stop with an error until one is listed (or, for the writer "
        "and the bookkeeper, a source has a `table_template`).",
    )
    metadata_columns: MetadataColumns = Field(
        default_factory=MetadataColumns, description="Metadata columns added to every row."
    )
    transport: Transport = Field(
        default_factory=TxLogTransport, description="How writers hand monikers to the bookkeeper."
    )
    catalog: CatalogConfig = Field(
        default_factory=CatalogConfig, description="The Iceberg catalog."
    )
    spark: SparkConfig = Field(
        default_factory=SparkConfig, description="Spark, for the writer and the reaper."
    )
    group: GroupConfig = Field(
        default_factory=GroupConfig,
        description="Leases and the orphan grace, shared by writers, bookkeeper and reaper.",
    )
    writer: WriterConfig = Field(default_factory=WriterConfig, description="The Spark writer job.")
    bookkeeper: BookkeeperConfig = Field(
        default_factory=BookkeeperConfig, description="The committing service."
    )
    reaper: ReaperConfig = Field(default_factory=ReaperConfig, description="Scheduled maintenance.")

    _development: DevelopmentSections = PrivateAttr(default_factory=DevelopmentSections)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, raw: Any) -> Any:
        return move_renamed_keys(raw)

    @model_validator(mode="before")
    @classmethod
    def _without_development_sections(cls, raw: Any) -> Any:
        # Known sections, not typos: the loader keeps them for the development tools.
        if isinstance(raw, dict) and any(name in raw for name in DEVELOPMENT_SECTIONS):
            return {key: value for key, value in raw.items() if key not in DEVELOPMENT_SECTIONS}
        return raw

    @property
    def development(self) -> DevelopmentSections:
        """The file's development sections (`DEVELOPMENT_SECTIONS`), which no service reads."""
        return self._development

    def with_development(self, development: DevelopmentSections) -> IcekeeperConfig:
        """This config, carrying `development`: the loader's, or the original's when a tool
        rebuilds a config from its dump (which has no development sections)."""
        self._development = development
        return self

    @model_validator(mode="after")
    def _references_resolve(self) -> IcekeeperConfig:
        source_names = [source.name for source in self.sources]
        if len(set(source_names)) != len(source_names):
            raise ValueError(f"source names must be unique, got {source_names}")
        identifiers = [table.identifier for table in self.tables]
        if len(set(identifiers)) != len(identifiers):
            raise ValueError(f"table identifiers must be unique, got {identifiers}")
        for index, table in enumerate(self.tables):
            if not source_names:
                raise ValueError(
                    f"tables[{index}].source: the config lists no source for {table.identifier} "
                    f"to read; add one under `sources:` (named {table.source!r}, with "
                    "`bootstrap_servers`, `schema_registry_url` and `topics`)"
                )
            if table.source not in source_names:
                raise ValueError(
                    f"tables[{index}].source: no source named {table.source!r} (sources: "
                    f"{source_names})"
                )
        return self

    def source(self, name: str) -> KafkaSource:
        """The source called ``name``."""
        for source in self.sources:
            if source.name == name:
                return source
        raise KeyError(name)

    def table(self, identifier: str) -> TableSpec:
        """The spec of table ``identifier``; a table only
        a `table_template` names gets the defaults."""
        for spec in self.tables:
            if spec.identifier == identifier:
                return spec
        return TableSpec(identifier=identifier)
