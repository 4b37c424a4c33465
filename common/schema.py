"""Schema conversion: Avro (Debezium envelopes) -> Iceberg schema with field ids -> Spark types.

Avro is the hub, as in seed 000: a writer turns each registered Avro schema into the Iceberg
schema of the flattened rows (metadata columns + row columns), gives every field the id the
table already uses for that name, and new fields the ids the bookkeeper will give them, so
the Parquet files it writes read correctly under the evolved table. Spark types carry the ids
as `parquet.field.id` metadata, which Spark's Parquet writer stores in the file.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyiceberg.schema import Schema, assign_fresh_schema_ids
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
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from icekeeper.common.config.model import MetadataColumns

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata

PARQUET_FIELD_ID = "parquet.field.id"


class SchemaConversionError(ValueError):
    """An Avro schema icekeeper cannot map to Iceberg (the reason names the field)."""


@dataclass(frozen=True)
class Column:
    """A top-level column before ids are assigned: name, Iceberg type, required."""

    name: str
    type: IcebergType
    required: bool = False
    semantic: str | None = None
    """The Kafka Connect / Debezium semantic type (`connect.name`) whose carrier value the writer
    converts into `type` (e.g. `io.debezium.time.MicroTimestamp`: a long of micros -> timestamp)."""


# -- Avro -> Iceberg -----------------------------------------------------------------------------

COLLECTION = "collection"
"""Semantic type of an array or map column: kept as JSON text (see `avro_to_iceberg`)."""
MAX_DECIMAL_PRECISION = 38
"""Iceberg's (and Spark's) widest decimal; MariaDB's DECIMAL goes to 65 digits."""
WIDE_DECIMAL = "avro.wide-decimal:"
"""Semantic type of a decimal wider than Iceberg's, followed by its scale: kept as exact text."""

SEMANTIC_TYPES: dict[str, IcebergType] = {
    # Debezium's temporal types (time.precision.mode adaptive, adaptive_time_microseconds, connect).
    "io.debezium.time.Date": DateType(),
    "io.debezium.time.Timestamp": TimestampType(),
    "io.debezium.time.MicroTimestamp": TimestampType(),
    "io.debezium.time.NanoTimestamp": TimestampType(),
    "io.debezium.time.ZonedTimestamp": TimestamptzType(),
    # Time of day is text: MariaDB/MySQL TIME runs from -838:59:59 to 838:59:59, which no Iceberg
    # `time` holds, and Iceberg 1.11's Spark cannot read a `time` column at all (so neither could
    # Spark users nor the reaper's Spark actions; apache/iceberg#16663).
    "io.debezium.time.Time": StringType(),
    "io.debezium.time.MicroTime": StringType(),
    "io.debezium.time.NanoTime": StringType(),
    "io.debezium.time.ZonedTime": StringType(),
    "io.debezium.time.Year": IntegerType(),
    "io.debezium.time.MicroDuration": LongType(),
    "io.debezium.time.NanoDuration": LongType(),
    "io.debezium.time.Interval": StringType(),
    "org.apache.kafka.connect.data.Time": StringType(),
    # Text-carried types stay text; Spark writes no Parquet UUID, so a uuid column is its text.
    "io.debezium.data.Json": StringType(),
    "io.debezium.data.Enum": StringType(),
    "io.debezium.data.EnumSet": StringType(),
    "io.debezium.data.Uuid": StringType(),
    "io.debezium.data.Xml": StringType(),
    "io.debezium.data.Ltree": StringType(),
    "io.debezium.data.Bits": BinaryType(),
    # NUMERIC without a scale: each value has its own scale, which no Iceberg decimal column keeps
    # exactly, so the exact digits are kept as text.
    "io.debezium.data.VariableScaleDecimal": StringType(),
    # Spatial values as their well-known binary (the struct's `wkb`).
    "io.debezium.data.geometry.Geometry": BinaryType(),
    "io.debezium.data.geometry.Geography": BinaryType(),
    "io.debezium.data.geometry.Point": BinaryType(),
}
"""Iceberg type of each Connect / Debezium semantic type whose carrier is not what users expect."""

_AVRO_PRIMITIVES: dict[str, IcebergType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}


def avro_to_iceberg(avro_type: Any, path: str = "") -> tuple[IcebergType, bool]:
    """Iceberg type of an Avro type, and whether it is optional (a union with null).

    Struct, list and map children get placeholder ids; `assign_ids` replaces them.
    """
    if isinstance(avro_type, list):
        branches = [branch for branch in avro_type if branch != "null"]
        if len(branches) != 1:
            raise SchemaConversionError(
                f"{path or 'value'}: unions of several types are not supported ({avro_type})"
            )
        converted, _ = avro_to_iceberg(branches[0], path)
        return converted, "null" in avro_type
    if isinstance(avro_type, str):
        if avro_type in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[avro_type], False
        raise SchemaConversionError(f"{path}: named type {avro_type!r} must be resolved first")
    if not isinstance(avro_type, dict):
        raise SchemaConversionError(f"{path}: not an Avro type: {avro_type!r}")
    kind, logical = avro_type.get("type"), avro_type.get("logicalType")
    semantic = avro_type.get("connect.name")
    if semantic in SEMANTIC_TYPES:
        return SEMANTIC_TYPES[semantic], False
    if logical == "decimal":
        if int(avro_type["precision"]) > MAX_DECIMAL_PRECISION:
            return StringType(), False  # the exact digits; see `semantic_type`
        return DecimalType(int(avro_type["precision"]), int(avro_type.get("scale", 0))), False
    if logical == "date":
        return DateType(), False
    if logical in ("timestamp-millis", "timestamp-micros"):
        return TimestamptzType(), False
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return TimestampType(), False
    if logical in ("time-millis", "time-micros"):
        return StringType(), False  # see SEMANTIC_TYPES: time of day is text
    if kind == "record":
        fields = []
        for index, field in enumerate(avro_type["fields"]):
            field_type, optional = avro_to_iceberg(
                field["type"], f"{path}.{field['name']}" if path else field["name"]
            )
            fields.append(
                NestedField(
                    field_id=1000 + index,
                    name=field["name"],
                    field_type=field_type,
                    required=not optional,
                )
            )
        return StructType(*fields), False
    if kind in ("array", "map"):
        # As JSON text: Spark's Parquet writer gives list elements and map keys/values no field
        # ids, and Iceberg readers (pyiceberg, Java) then cannot read the file at all.
        return StringType(), False
    if kind == "enum":
        return StringType(), False
    if kind == "fixed":
        return FixedType(int(avro_type["size"])), False
    if kind in _AVRO_PRIMITIVES:
        # A primitive with properties (Connect's int8/int16 markers, semantic types not mapped).
        return _AVRO_PRIMITIVES[kind], False
    raise SchemaConversionError(f"{path}: Avro type {kind!r} is not supported")


def resolve_named_types(
    schema: Any, known: dict[str, Any] | None = None, namespace: str = ""
) -> Any:
    """Inline references to named types (Debezium's `after` refers to `before`'s record by name)."""
    known = {} if known is None else known
    if isinstance(schema, str):
        full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        return known.get(full, known.get(schema, schema))
    if isinstance(schema, list):
        return [resolve_named_types(branch, known, namespace) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if kind in ("record", "enum", "fixed"):
        own_namespace = schema.get("namespace", namespace)
        name = schema["name"]
        full = name if "." in name else (f"{own_namespace}.{name}" if own_namespace else name)
        if kind == "record":
            resolved = dict(schema)
            known[full] = resolved
            resolved["fields"] = [
                {**field, "type": resolve_named_types(field["type"], known, own_namespace)}
                for field in schema["fields"]
            ]
            return resolved
        known[full] = schema
        return schema
    if kind == "array":
        return {**schema, "items": resolve_named_types(schema["items"], known, namespace)}
    if kind == "map":
        return {**schema, "values": resolve_named_types(schema["values"], known, namespace)}
    if isinstance(kind, (dict, list)):
        return {**schema, "type": resolve_named_types(kind, known, namespace)}
    return schema


@dataclass(frozen=True)
class EnvelopeShape:
    """What a value schema holds: Debezium envelope parts, or a plain row."""

    is_debezium: bool
    row: dict[str, Any]
    """The row record schema (`after`'s record for Debezium, the value itself otherwise)."""
    source: dict[str, Any] | None
    transaction: dict[str, Any] | None


def envelope_shape(value_schema: dict[str, Any]) -> EnvelopeShape:
    """Split a (resolved) value schema into row, source and transaction records."""
    if value_schema.get("type") != "record":
        raise SchemaConversionError("the value schema must be an Avro record")
    fields = {field["name"]: field["type"] for field in value_schema["fields"]}
    if {"after", "op", "source"} <= set(fields):
        row = _record_of(fields["after"]) or _record_of(fields.get("before"))
        if row is None:
            raise SchemaConversionError(
                "Debezium envelope without a row record in `after`/`before`"
            )
        return EnvelopeShape(
            True, row, _record_of(fields["source"]), _record_of(fields.get("transaction"))
        )
    return EnvelopeShape(False, value_schema, None, None)


def _record_of(avro_type: Any) -> dict[str, Any] | None:
    if isinstance(avro_type, list):
        return next(
            (
                branch
                for branch in avro_type
                if isinstance(branch, dict) and branch.get("type") == "record"
            ),
            None,
        )
    return avro_type if isinstance(avro_type, dict) and avro_type.get("type") == "record" else None


# -- flattened rows --------------------------------------------------------------------------------

KAFKA_COLUMN_TYPES: dict[str, IcebergType] = {
    "topic": StringType(),
    "partition": IntegerType(),
    "offset": LongType(),
    "timestamp": TimestamptzType(),
    "key": BinaryType(),
}


def metadata_columns(
    metadata: MetadataColumns,
    is_debezium: bool,
    source_types: dict[str, IcebergType] | None = None,
    transaction_types: dict[str, IcebergType] | None = None,
) -> list[Column]:
    """Seed 000's metadata columns, in its order: source, op, envelope ts, transaction, Kafka.

    Source and transaction columns take the types the envelope gives those fields (string when
    absent); they exist only for Debezium envelopes.
    """
    columns: list[Column] = []
    if is_debezium:
        source_types, transaction_types = source_types or {}, transaction_types or {}
        for name in metadata.source.columns:
            columns.append(
                Column(metadata.source.prefix + name, source_types.get(name, StringType()))
            )
        columns.append(Column(op_column(metadata), StringType()))
        columns.append(Column(envelope_ts_column(metadata), LongType()))
        for name in metadata.transaction.columns:
            columns.append(
                Column(
                    metadata.transaction.prefix + name, transaction_types.get(name, StringType())
                )
            )
    for name in metadata.kafka.columns:
        columns.append(Column(metadata.kafka.prefix + name, KAFKA_COLUMN_TYPES[name]))
    return columns


def record_types(record: dict[str, Any] | None) -> dict[str, IcebergType]:
    """Field name -> Iceberg type of an Avro record (empty for None)."""
    if record is None:
        return {}
    return {
        field["name"]: avro_to_iceberg(field["type"], field["name"])[0]
        for field in record["fields"]
    }


def op_column(metadata: MetadataColumns) -> str:
    return f"{metadata.source.prefix}op"


def envelope_ts_column(metadata: MetadataColumns) -> str:
    return f"{metadata.source.prefix}ts_ms_r"


def row_columns(shape: EnvelopeShape, primary_key: Iterable[str] = ()) -> list[Column]:
    """The row's columns; key columns are required, the rest optional (deletes carry only keys)."""
    keys = {name.lower() for name in primary_key}
    columns = []
    for field in shape.row["fields"]:
        field_type, _ = avro_to_iceberg(field["type"], field["name"])
        columns.append(
            Column(
                field["name"],
                field_type,
                required=field["name"].lower() in keys,
                semantic=semantic_type(field["type"]),
            )
        )
    return columns


def semantic_type(avro_type: Any) -> str | None:
    """The mapped semantic type (`connect.name`, or Avro's `time-*` logical types) of a field."""
    if isinstance(avro_type, list):
        return next((name for branch in avro_type if (name := semantic_type(branch))), None)
    if not isinstance(avro_type, dict):
        return None
    if avro_type.get("connect.name") in SEMANTIC_TYPES:
        return avro_type["connect.name"]
    if avro_type.get("logicalType") in ("time-millis", "time-micros"):
        return "avro." + avro_type["logicalType"]
    if avro_type.get("type") in ("array", "map"):
        return COLLECTION
    if (
        avro_type.get("logicalType") == "decimal"
        and int(avro_type["precision"]) > MAX_DECIMAL_PRECISION
    ):
        return f"{WIDE_DECIMAL}{int(avro_type.get('scale', 0))}"
    return None


def merge_columns(versions: list[list[Column]]) -> list[Column]:
    """Union of several schema versions' columns, by name, in first-seen order, types widened.

    A column's type is the widest seen (int -> long, float -> double, decimal precision). Types
    that cannot widen keep the newest; the bookkeeper then rejects the change with its reason.
    """
    merged: dict[str, Column] = {}
    for columns in versions:
        for column in columns:
            current = merged.get(column.name)
            if current is None:
                merged[column.name] = column
            else:
                merged[column.name] = Column(
                    column.name,
                    wider_type(current.type, column.type),
                    current.required and column.required,
                )
    return list(merged.values())


def wider_type(old: IcebergType, new: IcebergType) -> IcebergType:
    """The type both fit in, when Iceberg allows promoting one to it; otherwise `new`."""
    if old == new:
        return old
    pairs = {(IntegerType(), LongType()): LongType(), (FloatType(), DoubleType()): DoubleType()}
    for (a, b), wide in pairs.items():
        if {old, new} == {a, b}:
            return wide
    if isinstance(old, DecimalType) and isinstance(new, DecimalType) and old.scale == new.scale:
        return DecimalType(max(old.precision, new.precision), old.scale)
    if isinstance(old, StructType) and isinstance(new, StructType):
        merged = merge_columns(
            [
                [Column(f.name, f.field_type, f.required) for f in old.fields],
                [Column(f.name, f.field_type, f.required) for f in new.fields],
            ]
        )
        return StructType(
            *[NestedField(1000 + i, c.name, c.type, c.required) for i, c in enumerate(merged)]
        )
    return new


# -- field ids -------------------------------------------------------------------------------------


def assign_ids(
    columns: list[Column], table: TableMetadata | None, identifier_names: Iterable[str] = ()
) -> Schema:
    """A schema for `columns` whose ids agree with the table's (`table`: its metadata).

    Names the table's current schema has keep their ids; new names, nested fields and list and
    map ids get ids after the table's `last-column-id`, in order (the order in which the
    bookkeeper will add them). Not after the current schema's highest id: that of a dropped
    column may be above it, and old files' values under that id would read as the new column.
    So a column re-added under a dropped column's name is a new column, as in Iceberg. Without a
    table, ids are assigned exactly as pyiceberg's `create_table` will assign them.
    """
    identifier_names = list(identifier_names)
    if table is None:
        fields = [
            NestedField(1000 + index, column.name, column.type, column.required)
            for index, column in enumerate(columns)
        ]
        provisional = Schema(*fields)
        fresh = assign_fresh_schema_ids(provisional)
        ids = [fresh.find_field(name).field_id for name in identifier_names]
        return Schema(*fresh.fields, identifier_field_ids=ids)
    existing = table.schema()
    counter = itertools.count(max(table.last_column_id, existing.highest_field_id) + 1)
    fields = []
    for column in columns:
        try:
            old = existing.find_field(column.name)
        except ValueError:
            old = None
        field_id = old.field_id if old is not None else next(counter)
        old_type = old.field_type if old is not None else None
        fields.append(
            NestedField(
                field_id, column.name, _with_ids(column.type, old_type, counter), column.required
            )
        )
    schema = Schema(*fields)
    return Schema(
        *fields,
        identifier_field_ids=[schema.find_field(name).field_id for name in identifier_names],
    )


def _with_ids(
    field_type: IcebergType, existing: IcebergType | None, counter: Iterable[int]
) -> IcebergType:
    """Nested ids: reuse those of the existing type by name, new ones from `counter`."""
    if isinstance(field_type, StructType):
        existing_fields = (
            {f.name: f for f in existing.fields} if isinstance(existing, StructType) else {}
        )
        fields = []
        for nested in field_type.fields:
            old = existing_fields.get(nested.name)
            field_id = old.field_id if old is not None else next(counter)  # type: ignore[call-overload]
            fields.append(
                NestedField(
                    field_id,
                    nested.name,
                    _with_ids(nested.field_type, old.field_type if old else None, counter),
                    nested.required,
                )
            )
        return StructType(*fields)
    if isinstance(field_type, ListType):
        element_id = existing.element_id if isinstance(existing, ListType) else next(counter)  # type: ignore[call-overload]
        old_element = existing.element_type if isinstance(existing, ListType) else None
        return ListType(
            element_id,
            _with_ids(field_type.element_type, old_element, counter),
            field_type.element_required,
        )
    if isinstance(field_type, MapType):
        key_id = existing.key_id if isinstance(existing, MapType) else next(counter)  # type: ignore[call-overload]
        value_id = existing.value_id if isinstance(existing, MapType) else next(counter)  # type: ignore[call-overload]
        old_value = existing.value_type if isinstance(existing, MapType) else None
        return MapType(
            key_id,
            field_type.key_type,
            value_id,
            _with_ids(field_type.value_type, old_value, counter),
            field_type.value_required,
        )
    return field_type


# -- Iceberg -> Spark ------------------------------------------------------------------------------


def spark_type(field_type: IcebergType):  # noqa: ANN201 - pyspark types imported lazily
    """The Spark type Spark's Parquet writer turns into this Iceberg type (nested ids included)."""
    from pyspark.sql import types as T

    if isinstance(field_type, StructType):
        return T.StructType([spark_field(nested) for nested in field_type.fields])
    if isinstance(field_type, ListType):
        return T.ArrayType(spark_type(field_type.element_type), not field_type.element_required)
    if isinstance(field_type, MapType):
        return T.MapType(
            spark_type(field_type.key_type),
            spark_type(field_type.value_type),
            not field_type.value_required,
        )
    if isinstance(field_type, DecimalType):
        return T.DecimalType(field_type.precision, field_type.scale)
    simple = {
        BooleanType: T.BooleanType,
        IntegerType: T.IntegerType,
        LongType: T.LongType,
        FloatType: T.FloatType,
        DoubleType: T.DoubleType,
        StringType: T.StringType,
        BinaryType: T.BinaryType,
        FixedType: T.BinaryType,
        DateType: T.DateType,
        TimestamptzType: T.TimestampType,
        TimestampType: T.TimestampNTZType,
    }
    for iceberg_class, spark_class in simple.items():
        if isinstance(field_type, iceberg_class):
            return spark_class()
    raise SchemaConversionError(f"no Spark type for {field_type}")


def spark_field(field: NestedField):  # noqa: ANN201
    from pyspark.sql import types as T

    return T.StructField(
        field.name,
        spark_type(field.field_type),
        not field.required,
        metadata={PARQUET_FIELD_ID: field.field_id},
    )


def spark_schema(schema: Schema):  # noqa: ANN201
    from pyspark.sql import types as T

    return T.StructType([spark_field(field) for field in schema.fields])


def is_primitive(field_type: IcebergType) -> bool:
    return isinstance(field_type, PrimitiveType)


def iceberg_type_from_spark(data_type) -> IcebergType:  # noqa: ANN001 - a pyspark DataType
    """Iceberg type of a Spark type (for schemas inferred from JSON); nested ids are
    placeholders."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.StructType):
        return StructType(
            *[
                NestedField(1000 + i, f.name, iceberg_type_from_spark(f.dataType), False)
                for i, f in enumerate(data_type.fields)
            ]
        )
    if isinstance(data_type, (T.ArrayType, T.MapType)):
        return StringType()  # JSON text, as Avro collections (see `avro_to_iceberg`)
    if isinstance(data_type, T.DecimalType):
        return DecimalType(data_type.precision, data_type.scale)
    simple = {
        T.BooleanType: BooleanType,
        T.ByteType: IntegerType,
        T.ShortType: IntegerType,
        T.IntegerType: IntegerType,
        T.LongType: LongType,
        T.FloatType: FloatType,
        T.DoubleType: DoubleType,
        T.StringType: StringType,
        T.BinaryType: BinaryType,
        T.DateType: DateType,
        T.TimestampType: TimestamptzType,
        T.TimestampNTZType: TimestampType,
        T.NullType: StringType,
    }
    for spark_class, iceberg_class in simple.items():
        if isinstance(data_type, spark_class):
            return iceberg_class()
    raise SchemaConversionError(f"no Iceberg type for Spark type {data_type}")


def spark_sql_type(field_type: IcebergType) -> str:
    """The Spark SQL type name for CAST(... AS <type>)."""
    if isinstance(field_type, StructType):
        inner = ", ".join(
            f"`{f.name.replace('`', '``')}`: {spark_sql_type(f.field_type)}"
            for f in field_type.fields
        )
        return f"STRUCT<{inner}>"
    if isinstance(field_type, ListType):
        return f"ARRAY<{spark_sql_type(field_type.element_type)}>"
    if isinstance(field_type, MapType):
        return (
            f"MAP<{spark_sql_type(field_type.key_type)}, {spark_sql_type(field_type.value_type)}>"
        )
    if isinstance(field_type, DecimalType):
        return f"DECIMAL({field_type.precision}, {field_type.scale})"
    names = {
        BooleanType: "BOOLEAN",
        IntegerType: "INT",
        LongType: "BIGINT",
        FloatType: "FLOAT",
        DoubleType: "DOUBLE",
        StringType: "STRING",
        BinaryType: "BINARY",
        FixedType: "BINARY",
        DateType: "DATE",
        TimestamptzType: "TIMESTAMP",
        TimestampType: "TIMESTAMP_NTZ",
    }
    for iceberg_class, name in names.items():
        if isinstance(field_type, iceberg_class):
            return name
    raise SchemaConversionError(f"no Spark SQL type for {field_type}")
