"""Flatten decoded change events into a table's rows with Arrow: metadata columns + the row.

The same rows as `spark_sql_engine/sql_flatten.py` builds in Spark SQL: the row is `after`, or
`before` for a delete; metadata columns come from the envelope (`source`, `op`, `ts_ms`,
`transaction`) and the Kafka record; each column is cast to its Iceberg type, with the field ids of
the table's schema (`arrow_schema`), which pyarrow writes into the Parquet file as Iceberg needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from icekeeper.common.config.model import MetadataColumns
from icekeeper.common.schema import envelope_ts_column, op_column
from icekeeper.writers.arrow_engine.arrow_conversions import converted

FIELD_ID = b"PARQUET:field_id"

_SIMPLE: dict[type, pa.DataType] = {
    BooleanType: pa.bool_(),
    IntegerType: pa.int32(),
    LongType: pa.int64(),
    FloatType: pa.float32(),
    DoubleType: pa.float64(),
    StringType: pa.string(),
    BinaryType: pa.binary(),
    FixedType: pa.binary(),
    DateType: pa.date32(),
    TimestampType: pa.timestamp("us"),
    TimestamptzType: pa.timestamp("us", tz="UTC"),
}


def arrow_type(field_type: IcebergType) -> pa.DataType:
    """The Arrow type pyarrow writes as the Parquet type Spark writes for this Iceberg type."""
    if isinstance(field_type, StructType):
        return pa.struct([arrow_field(nested) for nested in field_type.fields])
    if isinstance(field_type, DecimalType):
        return pa.decimal128(field_type.precision, field_type.scale)
    for iceberg_class, arrow in _SIMPLE.items():
        if isinstance(field_type, iceberg_class):
            return arrow
    raise ValueError(f"no Arrow type for {field_type} in the arrow engine")


def arrow_field(field: NestedField) -> pa.Field:
    # Nullable like Spark's projected columns; the Iceberg schema says which are required.
    return pa.field(
        field.name,
        arrow_type(field.field_type),
        nullable=True,
        metadata={FIELD_ID: str(field.field_id).encode()},
    )


def arrow_schema(schema: Schema) -> pa.Schema:
    return pa.schema([arrow_field(field) for field in schema.fields])


@dataclass(frozen=True)
class VersionPlan:
    """One registered schema version as the tasks decode and flatten it."""

    index: int
    schema_id: int
    schema_text: str
    resolved: dict
    is_debezium: bool
    row_semantics: dict[str, str | None]
    """Row column -> its semantic type (`common.schema.row_columns`), in the row's order."""
    source_fields: tuple[str, ...]
    transaction_fields: tuple[str, ...]
    unchecked: dict[str, frozenset[str]] = dataclass_field(default_factory=dict)
    """Envelope field -> its fields the writer skips, whose strings are not checked for UTF-8
    (`writers.version_shapes.skipped_envelope_fields`)."""


def field_of(struct: pa.Array, name: str) -> pa.Array:
    """A struct field, null wherever the struct itself is null (Arrow keeps children unmasked)."""
    child = pc.struct_field(struct, name)
    if struct.null_count == 0:
        return child
    return pc.if_else(pc.is_valid(struct), child, pa.nulls(len(child), child.type))


def whole(column: pa.ChunkedArray) -> pa.Array:
    """A column as one array (no copy when it is one chunk already, as polars gives it)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def row_image(decoded: pa.Table, version: VersionPlan, name: str) -> pa.Array:
    """The carrier value of row column `name`: from `after`, or `before` where `after` is null."""
    if not version.is_debezium:
        return whole(decoded.column(name))
    after = whole(decoded.column("after"))
    before = whole(decoded.column("before"))
    after_value = field_of(after, name)
    if after.null_count == 0:
        return after_value
    return pc.if_else(pc.is_valid(after), after_value, field_of(before, name))


@dataclass(frozen=True)
class VersionRows:
    """One version's records of a task (decoded), with the Kafka fields they came with."""

    version: VersionPlan
    decoded: pa.Table
    topic: str
    partition: int
    offsets: pa.Array
    timestamps_ms: pa.Array
    keys: pa.Array

    def envelope(self, name: str) -> pa.Array:
        return whole(self.decoded.column(name))

    def source_field(self, name: str) -> pa.Array | None:
        if not self.version.is_debezium or name not in self.version.source_fields:
            return None
        return field_of(self.envelope("source"), name)

    def converted_row(self) -> tuple[dict[str, pa.Array], pa.Array | None]:
        """Row columns converted to their Iceberg values, and a mask of records holding a value
        that does not convert (`unconvertible-value`), or None when none can fail."""
        columns: dict[str, pa.Array] = {}
        failed: pa.Array | None = None
        for name, semantic in self.version.row_semantics.items():
            value, not_converted = converted(row_image(self.decoded, self.version, name), semantic)
            columns[name] = value
            if not_converted is not None:
                failed = not_converted if failed is None else pc.or_(failed, not_converted)
        return columns, failed


def kafka_value(rows: VersionRows, field: str) -> pa.Array:
    count = len(rows.offsets)
    if field == "topic":
        return pa.repeat(pa.scalar(rows.topic, pa.string()), count)
    if field == "partition":
        return pa.repeat(pa.scalar(rows.partition, pa.int32()), count)
    if field == "offset":
        return rows.offsets
    if field == "timestamp":
        return pc.cast(pc.multiply(rows.timestamps_ms, 1000), pa.timestamp("us", tz="UTC"))
    return rows.keys


def table_rows(
    rows: VersionRows,
    row_columns: dict[str, pa.Array],
    schema: pa.Schema,
    metadata: MetadataColumns,
) -> pa.Table:
    """The version's records as rows of a table with `schema` (all of them: filter first)."""
    count = len(rows.offsets)
    columns = []
    for field in schema:
        value = _value(rows, row_columns, field.name, metadata)
        if value is None:
            value = pa.nulls(count, field.type)
        columns.append(_cast(value, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _value(
    rows: VersionRows, row_columns: dict[str, pa.Array], name: str, metadata: MetadataColumns
) -> pa.Array | None:
    """As `sql_flatten.value_sql`: a Kafka field, an envelope field, or a row column."""
    kafka = metadata.kafka
    if name.startswith(kafka.prefix) and name[len(kafka.prefix) :] in kafka.columns:
        return kafka_value(rows, name[len(kafka.prefix) :])
    version = rows.version
    if version.is_debezium:
        if name == op_column(metadata):
            return rows.envelope("op")
        if name == envelope_ts_column(metadata):
            return rows.envelope("ts_ms")
        source, transaction = metadata.source, metadata.transaction
        if name.startswith(source.prefix) and name[len(source.prefix) :] in source.columns:
            return rows.source_field(name[len(source.prefix) :])
        if (
            name.startswith(transaction.prefix)
            and name[len(transaction.prefix) :] in transaction.columns
        ):
            field = name[len(transaction.prefix) :]
            if field not in version.transaction_fields:
                return None
            return field_of(rows.envelope("transaction"), field)
    return row_columns.get(name)


def _cast(value: pa.Array, target: pa.DataType) -> pa.Array:
    if isinstance(value, pa.ChunkedArray):
        value = value.combine_chunks()
    if value.type == target:
        return value
    if pa.types.is_dictionary(value.type):
        value = value.dictionary_decode()
    if pa.types.is_struct(target) and pa.types.is_struct(value.type):
        children = [
            _cast(field_of(value, child.name), child.type)
            if value.type.get_field_index(child.name) >= 0
            else pa.nulls(len(value), child.type)
            for child in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=pc.is_null(value))
    return pc.cast(value, target)
