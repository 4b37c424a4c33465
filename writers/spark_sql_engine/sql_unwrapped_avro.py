"""`debezium-unwrapped-avro` on `spark-sql`: Debezium's `ExtractNewRecordState` output, as Avro.

The transform flattens each change event to its row. With `delete.tombstone.handling.mode:
rewrite` (Debezium 2.5 and later; before, `delete.handling.mode: rewrite`) a delete keeps its row
(the `before` image) and says `__deleted: "true"`; `add.fields` adds envelope and `source` fields
as `__<name>` (`__op`, `__ts_ms`, `__source_ts_ms`, `__db`, `__table`, ...).
Each record is decoded as plain Confluent-framed Avro (`decoding.decode_avro_confluent`), then
given back the envelope it was unwrapped from: the row is `after`, or `before` when the record is
a delete; `op` is `__op` (`d` when `__deleted` is true; `u` when the record does not say, since
without `__op` an insert cannot be told from an update); `ts_ms` is `__ts_ms`; `source` holds
`__source_ts_ms` as `ts_ms` and `__db`/`__table`/`__name` (or `__source_<field>`). From there on
a batch is written as any Debezium batch: metadata columns, event time, and an upsert table's
hard deletes, which take their key from the `before` image.

A field is taken as added by the transform only by the names `add.fields` gives (its default
`add.fields.prefix`, `__`): `__deleted`, the envelope's own `__op`/`__ts_ms`/`__ts_us`/`__ts_ns`,
a Debezium connector's `source` field (`__lsn`, `__db`, `__version`, ...: `SOURCE_FIELDS`), a
`transaction` field (`__id`, `__total_order`, `__data_collection_order`) and a struct-qualified
one (`__source_<field>`, `__transaction_<field>`), and only among the last fields: the transform
appends its fields after the row's columns (`makeUpdatedSchema`, then `InsertField` for
`__deleted`). Any other field, `__tag` say, or `__table` before the row's last column, is a
column of the row, as the source table has it. (A field `add.fields` renames, `ts_ms:TS`, is a
row column too: nothing tells it apart. The other way round, a row's own last columns with such
names, `__db` say, read as added.)

Without `__deleted` a delete cannot be seen: with the transform's defaults it reaches Kafka as a
tombstone, or not at all (`__op`, which `add.fields: op` adds under any delete handling, then never
says `d`), and an upsert table keeps the deleted row (as live, with soft deletes too). The writer
says so once per source and schema id (a warning naming the connector settings and the upsert
tables the batch's topics may feed), and docs/operations.md gives them.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from icekeeper.common.config.model import MetadataColumns
from icekeeper.common.schema import envelope_shape
from icekeeper.writers.engines import SourceBatch
from icekeeper.writers.registry import RegisteredSchema
from icekeeper.writers.spark_sql_engine import sql
from icekeeper.writers.spark_sql_engine.decoding import DecodedBatch, decode_avro_confluent
from icekeeper.writers.version_shapes import DEBEZIUM_SOURCE_FIELDS, VersionShape, shape_from_avro

log = logging.getLogger(__name__)

ADDED = "__"
"""The prefix `ExtractNewRecordState` gives the fields it adds (its `add.fields.prefix`)."""
ENVELOPE_FIELDS = {"deleted", "op", "ts_ms"}
"""Added fields that are the envelope's own and read by the writer."""
UNREAD_FIELDS = {"ts_us", "ts_ns", "id", "total_order", "data_collection_order"}
"""Added envelope and `transaction` fields the writer does not read (neither row columns nor
`source` fields)."""
SOURCE_FIELDS = frozenset(
    {
        # every connector
        "version", "connector", "name", "ts_ms", "ts_us", "ts_ns", "snapshot", "db", "sequence",
        "schema", "table",
        # PostgreSQL
        "txId", "lsn", "xmin",
        # MySQL, MariaDB
        "server_id", "gtid", "file", "pos", "row", "thread", "query",
        # SQL Server, Db2
        "change_lsn", "commit_lsn", "event_serial_no",
        # Oracle
        "scn", "commit_scn", "lcr_position", "rs_id", "ssn", "redo_thread", "user_name",
        "row_id", "commit_ts_ms", "start_scn", "start_ts_ms",
        # Vitess, Spanner, Informix, Cassandra
        "keyspace", "shard", "vgtid", "cluster",
    }
)  # fmt: skip
"""Debezium connectors' `source` fields: `add.fields` adds each as `__<field>` (unqualified)."""
QUALIFIED = ("source_", "transaction_")
"""`add.fields` names a struct-qualified field (`source.ts_ms`) `__<struct>_<field>`."""
SOURCE_TYPES = {"name": "string", "db": "string", "table": "string", "ts_ms": "long"}
DELETES_UNSEEN_WARNED: set[tuple[str, int]] = set()
"""(source, schema id) already warned about: deletes cannot be seen (warned once per process)."""


def decode(
    spark: SparkSession, raw: DataFrame, batch: SourceBatch, metadata: MetadataColumns
) -> DecodedBatch:
    decoded = decode_avro_confluent(raw, batch.schemas)
    envelopes = {}
    versions: list[VersionShape] = []
    for schema, flat in zip(batch.schemas, decoded.versions, strict=True):
        added = added_fields(schema.resolved)
        warn_if_deletes_unseen(batch, schema, added)
        envelopes[flat.column] = F.expr(envelope_sql(flat.column, schema.resolved, added))
        versions.append(
            shape_from_avro(flat.column, envelope_shape(envelope_schema(schema)), flat.schema_id)
        )
    frame = decoded.frame.withColumns(envelopes) if envelopes else decoded.frame
    return DecodedBatch(frame, versions, decoded.planned_schema_ids)


def is_added(name: str) -> bool:
    """True when field `name` is one `ExtractNewRecordState` adds (see the module docstring)."""
    if not name.startswith(ADDED):
        return False
    bare = name[len(ADDED) :]
    return (
        bare in ENVELOPE_FIELDS
        or bare in UNREAD_FIELDS
        or bare in SOURCE_FIELDS
        or bare.startswith(QUALIFIED)
    )


def added_names(record: dict[str, Any]) -> set[str]:
    """The names of the fields the transform added to `record`: the last fields that have such
    names. The transform appends its fields after the row's (`add.fields` in order, then
    `__deleted`), so a row column with such a name (`__table`) comes before a field that is none,
    at the least the row's own last column, and stays a column."""
    added: set[str] = set()
    for field in reversed(record["fields"]):
        if not is_added(field["name"]):
            break
        added.add(field["name"])
    return added


def added_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The fields the transform added, by their envelope name (`__source_ts_ms` -> `source_ts_ms`),
    with their Avro types."""
    added = added_names(record)
    return {f["name"][len(ADDED) :]: f["type"] for f in record["fields"] if f["name"] in added}


def _source_field(added: str) -> str | None:
    """The `source` field added field `added` (without its prefix) holds; None for one that is
    no `source` field (the envelope's, a transaction's)."""
    if added.startswith("source_"):
        return added.removeprefix("source_")
    return added if added in SOURCE_FIELDS and added not in ENVELOPE_FIELDS else None


def warn_if_deletes_unseen(
    batch: SourceBatch, schema: RegisteredSchema, added: dict[str, Any]
) -> None:
    """Warn, once per source and schema id, when records of `schema` feed upsert tables but cannot
    say they are deletes (no `__deleted`): the transform's defaults turn a delete into a tombstone,
    or drop it, and the deleted row stays (hard deletes) or never shows op `d` (soft deletes).
    `__op` alone does not help: `add.fields: op` adds it under any delete handling, but a delete
    reaches Kafka as a row (with `__deleted`) only in `rewrite` mode."""
    if "deleted" in added:
        return
    topics = {topic for topic, _ in batch.plan.read_ranges}
    tables = [
        t.identifier
        for t in batch.routes.tables
        if t.upsert and (not t.topics or topics & set(t.topics))
    ]
    key = (batch.source.name, schema.schema_id)
    if not tables or key in DELETES_UNSEEN_WARNED:
        return
    DELETES_UNSEEN_WARNED.add(key)
    log.warning(
        "debezium-unwrapped-avro records without __deleted feed upsert tables: their deletes "
        "cannot be seen, and deleted rows stay in the tables as live rows; set the connector's "
        "ExtractNewRecordState to `delete.tombstone.handling.mode: rewrite` (or "
        "rewrite-with-tombstone; Debezium 2.5 and later) or `delete.handling.mode: rewrite` "
        "(before 2.5), which adds __deleted, and `add.fields: op` for the op column",
        extra={
            "source": batch.source.name,
            "schema_id": schema.schema_id,
            "tables": tables,
        },
    )


def envelope_schema(schema: RegisteredSchema) -> dict[str, Any]:
    """The Debezium envelope the records were unwrapped from, as Avro: what `VersionShape` reads
    the row, `source` and metadata column types from."""
    record = schema.resolved
    added = added_fields(record)
    added_here = added_names(record)
    row = copy.deepcopy(record)
    row["fields"] = [f for f in row["fields"] if f["name"] not in added_here]
    source_types: dict[str, Any] = {
        name: ["null", avro_type] for name, avro_type in SOURCE_TYPES.items()
    }
    for name, avro_type in added.items():
        if (source_field := _source_field(name)) is not None:
            source_types[source_field] = avro_type
    return {
        "type": "record",
        "name": "Envelope",
        "fields": [
            {"name": "before", "type": ["null", row]},
            {"name": "after", "type": ["null", row]},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"]},
            {
                "name": "source",
                "type": {
                    "type": "record",
                    "name": "Source",
                    "fields": [{"name": n, "type": t} for n, t in source_types.items()],
                },
            },
        ],
    }


def envelope_sql(column: str, record: dict[str, Any], added: dict[str, Any]) -> str:
    """SQL turning version `column`'s unwrapped struct back into its envelope."""
    added_here = added_names(record)
    row = "named_struct({})".format(
        ", ".join(
            f"{sql.string(f['name'])}, {sql.path(column, f['name'])}"
            for f in record["fields"]
            if f["name"] not in added_here
        )
    )
    deleted = (
        " OR ".join(
            condition
            for condition in (
                f"lower(CAST({sql.path(column, ADDED + 'deleted')} AS STRING)) = 'true'"
                if "deleted" in added
                else None,
                f"{sql.path(column, ADDED + 'op')} = 'd'" if "op" in added else None,
            )
            if condition is not None
        )
        or "false"
    )
    said = f"CAST({sql.path(column, ADDED + 'op')} AS STRING)" if "op" in added else "NULL"
    ts = f"CAST({sql.path(column, ADDED + 'ts_ms')} AS BIGINT)" if "ts_ms" in added else "NULL"
    sources = {
        name: f"CAST(NULL AS {'BIGINT' if t == 'long' else 'STRING'})"
        for name, t in SOURCE_TYPES.items()
    }
    for name in added:
        if (source_field := _source_field(name)) is not None:
            sources[source_field] = sql.path(column, ADDED + name)
    source = "named_struct({})".format(
        ", ".join(f"{sql.string(name)}, {value}" for name, value in sources.items())
    )
    assert set(DEBEZIUM_SOURCE_FIELDS) <= set(sources)
    return (
        f"CASE WHEN {column} IS NULL THEN NULL ELSE named_struct("
        f"'before', CASE WHEN {deleted} THEN {row} END, "
        f"'after', CASE WHEN {deleted} THEN NULL ELSE {row} END, "
        f"'op', CASE WHEN {deleted} THEN 'd' ELSE coalesce({said}, 'u') END, "
        f"'ts_ms', {ts}, 'source', {source}) END"
    )
