"""Flatten decoded change events into a table's rows as Spark SQL: metadata columns + the row.

The row is `after`, or `before` for deletes (for a delete without `before`, the columns its
record key gives: `sql_record_keys.py`); metadata columns follow seed 000 (`_src_*`, the
operation, the envelope's ts_ms, `_tsc_*`, `_kfk_*`). The table's schema comes planned
(`writers/table_batch.py`: its versions' columns merged, with field ids agreeing with the table),
so the Parquet files read correctly after the bookkeeper evolves the table to it. Expressions are
Spark SQL text (see `sql.py`); field ids are attached in one final projection.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.schema import Schema
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from icekeeper.common.config.model import MetadataColumns
from icekeeper.common.schema import (
    PARQUET_FIELD_ID,
    envelope_ts_column,
    op_column,
    spark_sql_type,
)
from icekeeper.writers.spark_sql_engine import sql
from icekeeper.writers.spark_sql_engine.columns import (
    ERROR,
    EVENT_MS,
    HELPER_COLUMNS,
    KAFKA_OFFSET,
    KAFKA_PARTITION,
    KAFKA_TOPIC,
    SOURCE_DB,
    SOURCE_SERVER,
    SOURCE_TABLE,
)
from icekeeper.writers.spark_sql_engine.sql_conversions import converted_sql, failed_sql
from icekeeper.writers.version_shapes import VersionShape


@dataclass(frozen=True)
class FlatRows:
    """Flattened rows of one table plus helper columns,
    and the Iceberg schema of the row columns."""

    frame: DataFrame
    schema: Schema


def flatten(
    frame: DataFrame,
    versions: list[VersionShape],
    metadata: MetadataColumns,
    schema: Schema,
    carry: list[str] | None = None,
) -> FlatRows:
    """Rows of `versions` flattened into `schema`'s columns (`table_batch.table_schema`), each
    with its field id.

    The frame keeps the helper columns, and the columns named in `carry`, next to the row's.
    """
    projections = [
        f"CAST({value_sql(field.name, versions, metadata)} AS {spark_sql_type(field.field_type)}) "
        f"AS {sql.ident(field.name)}"
        for field in schema.fields
    ]
    projections += [f"{expression} AS {name}" for name, expression in helper_sql(versions).items()]
    projections += [ERROR, *(carry or [])]
    flat = frame.selectExpr(*projections)
    # Field ids travel as column metadata, which SQL text cannot set: one projection adds them.
    with_ids = flat.select(
        *[
            F.col(sql.ident(field.name)).alias(
                field.name, metadata={PARQUET_FIELD_ID: field.field_id}
            )
            for field in schema.fields
        ],
        *HELPER_COLUMNS,
        *(carry or []),
    )
    return FlatRows(with_ids, schema)


def helper_sql(versions: list[VersionShape]) -> dict[str, str]:
    """Event time, Debezium source names and Kafka position of each record."""
    debezium = [v for v in versions if v.is_debezium]

    def source_field(name: str) -> str:
        return (
            f"CAST({across(debezium, lambda v: sql.path(v.column, 'source', name))} AS STRING)"
            if debezium
            else "CAST(NULL AS STRING)"
        )

    source_ms = (
        f"CAST({across(debezium, lambda v: sql.path(v.column, 'source', 'ts_ms'))} AS BIGINT)"
        if debezium
        else "CAST(NULL AS BIGINT)"
    )
    return {
        EVENT_MS: f"coalesce({source_ms}, CAST(unix_micros(timestamp) / 1000 AS BIGINT))",
        SOURCE_DB: source_field("db"),
        SOURCE_TABLE: source_field("table"),
        SOURCE_SERVER: source_field("name"),
        KAFKA_TOPIC: "topic",
        KAFKA_PARTITION: "partition",
        KAFKA_OFFSET: "offset",
    }


def across(versions: list[VersionShape], pick) -> str:  # noqa: ANN001
    """The value from whichever version decoded this record (exactly one does)."""
    return sql.coalesce([pick(v) for v in versions])


def row_value_sql(name: str, versions: list[VersionShape]) -> str:
    """SQL for row column `name` of each record (null where no version has it)."""
    values = _row_values(name, versions)
    return sql.coalesce(values) if values else "NULL"


def row_value_is_null_sql(
    name: str, versions: list[VersionShape], case_insensitive: bool = False
) -> str:
    """SQL true where row column `name` is null, whichever version decoded the record."""
    names = {c.name for v in versions for c in v.row}
    if case_insensitive and name not in names:
        matches = [candidate for candidate in names if candidate.lower() == name.lower()]
        name = matches[0] if len(matches) == 1 else name
    return sql.all_of(f"{value} IS NULL" for value in _row_values(name, versions, converted=False))


def _row_values(name: str, versions: list[VersionShape], converted: bool = True) -> list[str]:
    """Per version that has column `name`, SQL for its value (null for records of other versions),
    converted from Debezium's carrier to the column's Iceberg type unless `converted` is False."""
    values = []
    for version in versions:
        column = next((c for c in version.row if c.name == name), None)
        if column is None:
            continue
        value = _carrier_sql(version, name)
        values.append(converted_sql(value, column.semantic) if converted else value)
    return values


def _carrier_sql(version: VersionShape, name: str) -> str:
    if not version.is_debezium:
        return sql.path(version.column, name)
    # The row is `after`, or `before` for a delete; never mix fields of the two. A delete without
    # `before` has the key columns its record key gives, if read (`sql_record_keys.py`).
    after, before = sql.path(version.column, "after"), sql.path(version.column, "before")
    image = f"CASE WHEN {after} IS NOT NULL THEN {sql.path(version.column, 'after', name)}"
    if name not in version.record_key_fields:
        return f"{image} ELSE {sql.path(version.column, 'before', name)} END"
    return (
        f"{image} WHEN {before} IS NOT NULL THEN {sql.path(version.column, 'before', name)} ELSE "
        f"{sql.path(version.record_key, name)} END"
    )


def unconvertible_sql(versions: list[VersionShape]) -> str:
    """SQL true for records holding a value their column's
    Iceberg type cannot take (see conversions)."""
    return sql.any_of(
        failed
        for version in versions
        for column in version.row
        if (failed := failed_sql(_carrier_sql(version, column.name), column.semantic)) is not None
    )


def value_sql(name: str, versions: list[VersionShape], metadata: MetadataColumns) -> str:
    """SQL for table column `name`: a Kafka field, an envelope field, or a row column."""
    kafka_prefix = metadata.kafka.prefix
    if name.startswith(kafka_prefix) and name[len(kafka_prefix) :] in metadata.kafka.columns:
        return sql.ident(name[len(kafka_prefix) :])
    debezium = [v for v in versions if v.is_debezium]
    if debezium:
        if name == op_column(metadata):
            return across(debezium, lambda v: sql.path(v.column, "op"))
        if name == envelope_ts_column(metadata):
            return across(debezium, lambda v: sql.path(v.column, "ts_ms"))
        source_prefix, transaction_prefix = metadata.source.prefix, metadata.transaction.prefix
        if name.startswith(source_prefix) and name[len(source_prefix) :] in metadata.source.columns:
            field = name[len(source_prefix) :]
            return across(
                debezium,
                lambda v: sql.path(v.column, "source", field) if field in v.source else "NULL",
            )
        if (
            name.startswith(transaction_prefix)
            and name[len(transaction_prefix) :] in metadata.transaction.columns
        ):
            field = name[len(transaction_prefix) :]
            return across(
                debezium,
                lambda v: (
                    sql.path(v.column, "transaction", field) if field in v.transaction else "NULL"
                ),
            )
    return row_value_sql(name, versions)
