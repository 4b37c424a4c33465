"""Flatten decoded change events into table rows: metadata columns + the row, with field ids.

The row is `after`, or `before` for deletes; metadata columns follow seed 000 (`_src_*`, the
operation, the envelope's ts_ms, `_tsc_*`, `_kfk_*`). Several schema versions become one set of
columns (union by name, types widened) whose Iceberg field ids agree with the table, so the
Parquet files read correctly after the bookkeeper evolves the table to this schema.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.schema import Schema
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from common.config.model import MetadataColumns
from common.schema import (
    PARQUET_FIELD_ID, Column, assign_ids, envelope_ts_column, merge_columns, metadata_columns, op_column, spark_type,
)
from writers.decode import ERROR, VersionShape

EVENT_MS = "_ik_event_ms"
SOURCE_DB = "_ik_source_db"
SOURCE_TABLE = "_ik_source_table"
SOURCE_SERVER = "_ik_source_server"
KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET = "_ik_topic", "_ik_partition", "_ik_offset"
HELPER_COLUMNS = (ERROR, EVENT_MS, SOURCE_DB, SOURCE_TABLE, SOURCE_SERVER, KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET)
"""Columns next to the row columns that the writer uses and drops before writing files."""


@dataclass(frozen=True)
class FlatRows:
    """Flattened rows of one table plus helper columns, and the Iceberg schema of the row columns."""

    frame: DataFrame
    schema: Schema


def table_columns(versions: list[VersionShape], metadata: MetadataColumns) -> list[Column]:
    """Metadata columns then row columns, merged over `versions`."""
    debezium = [v for v in versions if v.is_debezium]
    meta = metadata_columns(metadata, bool(debezium), _merged_types([v.source for v in debezium]), _merged_types([v.transaction for v in debezium]))
    return meta + merge_columns([v.row for v in versions])


def _merged_types(type_maps: list[dict]) -> dict:
    merged = merge_columns([[Column(name, t) for name, t in types.items()] for types in type_maps])
    return {column.name: column.type for column in merged}


def flatten(frame: DataFrame, versions: list[VersionShape], metadata: MetadataColumns, existing: Schema | None,
            primary_key: list[str]) -> FlatRows:
    """Rows of `versions` flattened into the table's columns (ids from `existing` where it has them)."""
    columns = table_columns(versions, metadata)
    key_names = _resolve_keys(columns, primary_key)
    columns = [Column(c.name, c.type, c.name in key_names) for c in columns]
    schema = assign_ids(columns, existing, key_names)
    selected: list[SparkColumn] = []
    for field in schema.fields:
        expression = _value_of(field.name, versions, metadata)
        target = spark_type(field.field_type)
        selected.append(expression.cast(target).alias(field.name, metadata={PARQUET_FIELD_ID: field.field_id}))
    debezium = [v for v in versions if v.is_debezium]
    source_ms = _across(debezium, lambda v: F.col(v.column)["source"]["ts_ms"]) if debezium else F.lit(None)
    helpers = [
        F.coalesce(source_ms.cast("long"), (F.unix_micros(F.col("timestamp")) / 1000).cast("long")).alias(EVENT_MS),
        (_across(debezium, lambda v: F.col(v.column)["source"]["db"]) if debezium else F.lit(None)).cast("string").alias(SOURCE_DB),
        (_across(debezium, lambda v: F.col(v.column)["source"]["table"]) if debezium else F.lit(None)).cast("string").alias(SOURCE_TABLE),
        (_across(debezium, lambda v: F.col(v.column)["source"]["name"]) if debezium else F.lit(None)).cast("string").alias(SOURCE_SERVER),
        F.col("topic").alias(KAFKA_TOPIC), F.col("partition").alias(KAFKA_PARTITION), F.col("offset").alias(KAFKA_OFFSET),
    ]
    error = F.col(ERROR)
    if key_names:
        missing_key = F.lit(False)
        for name in key_names:
            missing_key = missing_key | F.col(name).isNull()
        error = F.when(error.isNull() & missing_key, F.lit("missing-key")).otherwise(error)
    flat = frame.select(*selected, *helpers, error.alias(ERROR))
    return FlatRows(flat, schema)


def _resolve_keys(columns: list[Column], primary_key: list[str]) -> list[str]:
    names = [c.name for c in columns]
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


def _across(versions: list[VersionShape], pick) -> SparkColumn:  # noqa: ANN001
    """The value from whichever version decoded this record (exactly one does)."""
    values = [pick(v) for v in versions]
    return values[0] if len(values) == 1 else F.coalesce(*values)


def row_value(name: str, versions: list[VersionShape], metadata: MetadataColumns, case_insensitive: bool = False) -> SparkColumn:
    """The value of column `name` of each record (null where no version has it)."""
    if case_insensitive:
        names = {c.name for v in versions for c in v.row}
        if name not in names:
            matches = [candidate for candidate in names if candidate.lower() == name.lower()]
            name = matches[0] if len(matches) == 1 else name
    return _value_of(name, versions, metadata)


def _value_of(name: str, versions: list[VersionShape], metadata: MetadataColumns) -> SparkColumn:
    kafka_prefix = metadata.kafka.prefix
    if name.startswith(kafka_prefix) and name[len(kafka_prefix):] in metadata.kafka.columns:
        return F.col(name[len(kafka_prefix):])
    debezium = [v for v in versions if v.is_debezium]
    if name == op_column(metadata) and debezium:
        return _across(debezium, lambda v: F.col(v.column)["op"])
    if name == envelope_ts_column(metadata) and debezium:
        return _across(debezium, lambda v: F.col(v.column)["ts_ms"])
    source_prefix, transaction_prefix = metadata.source.prefix, metadata.transaction.prefix
    if name.startswith(source_prefix) and name[len(source_prefix):] in metadata.source.columns and debezium:
        return _across([v for v in debezium if name[len(source_prefix):] in v.source] or debezium,
                       lambda v: F.col(v.column)["source"][name[len(source_prefix):]] if name[len(source_prefix):] in v.source else F.lit(None))
    if name.startswith(transaction_prefix) and name[len(transaction_prefix):] in metadata.transaction.columns and debezium:
        field = name[len(transaction_prefix):]
        return _across(debezium, lambda v: F.col(v.column)["transaction"][field] if field in v.transaction else F.lit(None))
    having = [v for v in versions if any(c.name == name for c in v.row)]
    if not having:
        return F.lit(None)
    values = []
    for version in having:
        struct = F.col(version.column)
        if version.is_debezium:
            # The row is `after`, or `before` for a delete; never mix fields of the two.
            values.append(F.when(struct["after"].isNotNull(), struct["after"][name]).otherwise(struct["before"][name]))
        else:
            values.append(struct[name])
    return values[0] if len(values) == 1 else F.coalesce(*values)
