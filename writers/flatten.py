"""Flatten decoded change events into table rows: metadata columns + the row, with field ids.

The row is `after`, or `before` for deletes (for a delete without `before`, the columns its
record key gives: `record_keys.py`); metadata columns follow seed 000 (`_src_*`, the operation,
the envelope's ts_ms, `_tsc_*`, `_kfk_*`). Several schema versions become one set of
columns (union by name, types widened) whose Iceberg field ids agree with the table, so the
Parquet files read correctly after the bookkeeper evolves the table to this schema.
Expressions are Spark SQL text (see `sql.py`); field ids are attached in one final projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyiceberg.schema import Schema
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from icekeeper.common.config.model import MetadataColumns
from icekeeper.common.schema import (
    PARQUET_FIELD_ID,
    Column,
    assign_ids,
    envelope_ts_column,
    merge_columns,
    metadata_columns,
    op_column,
    spark_sql_type,
)
from icekeeper.writers import sql
from icekeeper.writers.columns import (
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
from icekeeper.writers.conversions import converted_sql, failed_sql
from icekeeper.writers.decode import VersionShape

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata


@dataclass(frozen=True)
class FlatRows:
    """Flattened rows of one table plus helper columns,
    and the Iceberg schema of the row columns."""

    frame: DataFrame
    schema: Schema


def table_columns(versions: list[VersionShape], metadata: MetadataColumns) -> list[Column]:
    """Metadata columns then row columns, merged over `versions`."""
    debezium = [v for v in versions if v.is_debezium]
    meta = metadata_columns(
        metadata,
        bool(debezium),
        _merged_types([v.source for v in debezium]),
        _merged_types([v.transaction for v in debezium]),
    )
    return meta + merge_columns([v.row for v in versions])


def _merged_types(type_maps: list[dict]) -> dict:
    merged = merge_columns([[Column(name, t) for name, t in types.items()] for types in type_maps])
    return {column.name: column.type for column in merged}


def flatten(
    frame: DataFrame,
    versions: list[VersionShape],
    metadata: MetadataColumns,
    table: TableMetadata | None,
    primary_key: list[str],
    carry: list[str] | None = None,
) -> FlatRows:
    """Rows of `versions` flattened into the table's columns, with ids from `table`'s metadata
    (`assign_ids`: its current schema's by name, new ones after its last-column-id).

    The frame keeps the helper columns, and the columns named in `carry`, next to the row's.
    """
    columns = table_columns(versions, metadata)
    key_names = resolve_keys([c.name for c in columns], primary_key)
    columns = [Column(c.name, c.type, c.name in key_names) for c in columns]
    schema = assign_ids(columns, table, key_names)
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


def resolve_keys(names: list[str], primary_key: list[str]) -> list[str]:
    """Key columns as the schema spells them (seed 000 wrote `id1,id2` for `ID1`, `ID2`)."""
    resolved = []
    for key in primary_key:
        if key in names:
            resolved.append(key)
            continue
        matches = [name for name in names if name.lower() == key.lower()]
        if len(matches) != 1:
            raise ValueError(f"primary key column {key!r} is not among the columns {names}")
        resolved.append(matches[0])
    return resolved


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
    # `before` has the key columns its record key gives, if read (`record_keys.py`).
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
