"""Kafka Connect's JSON schemas (JsonConverter, `schemas.enable=true`) as the Avro the rest reads.

A Debezium JSON record carries its Connect schema beside its payload. This module turns that
schema into the Avro type Connect's AvroConverter registers for it (`connect.name` for semantic
types, the `decimal` logical type for Connect's Decimal, `date` / `timestamp-millis` /
`time-millis` for Connect's Date / Timestamp / Time), so `common.schema` gives a table the same
Iceberg types from Debezium JSON as from Debezium Avro. It also says how JSON carries each value
(bytes and decimals as base64 text) and, as Spark SQL, how to turn that carrier into the value
`from_avro` would have given, so everything after decoding is the same for both formats.

Invariant: a JSON value is never silently replaced by null. Base64 is decoded by the JSON parser
(`from_json` into binary), which marks a record whose text is no base64 as corrupt; each
conversion here that can fail (a decimal that does not fit its column) has a failure condition
(`conversion_failures_sql`) that sends the record to the dead letters.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import types as T

from icekeeper.common.schema import SchemaConversionError
from icekeeper.writers.spark_sql_engine import sql
from icekeeper.writers.spark_sql_engine.sql_conversions import connect_decimal_sql

CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
ICEBERG_MAX_PRECISION = 38
_CONNECT_LOGICAL = {
    "org.apache.kafka.connect.data.Date": ("int32", "int", "date"),
    "org.apache.kafka.connect.data.Timestamp": ("int64", "long", "timestamp-millis"),
    "org.apache.kafka.connect.data.Time": ("int32", "int", "time-millis"),
}
"""Connect's own logical types: (Connect type, Avro
type, Avro logical type), as AvroConverter maps them."""
_PRIMITIVES = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "long",
    "float32": "float",
    "float64": "double",
    # JsonConverter writes FLOAT32 / FLOAT64 as "float" / "double".
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}
_MAX_TIMESTAMP_MILLIS = 9_223_372_036_854_775
"""timestamp_millis() overflows past this (Spark keeps microseconds in a long)."""


def is_connect_struct(schema: Any) -> bool:
    """True for a Connect struct schema with its fields: something types can be taken from.

    JsonConverter writes `"schema": null` for values without a schema; a `schema` without a list
    of fields carries no types either, and its records are decoded as schemaless JSON.
    """
    return (
        isinstance(schema, dict)
        and schema.get("type") == "struct"
        and isinstance(schema.get("fields"), list)
    )


def avro_from_connect(schema: dict[str, Any]) -> dict[str, Any]:
    """The Avro record type Connect's AvroConverter registers for a top-level Connect struct schema.

    Raises:
        SchemaConversionError: a type Iceberg cannot hold (the message names the field), e.g. a
            Decimal wider than 38 digits or a map whose keys are not strings.
    """
    if not is_connect_struct(schema):
        raise SchemaConversionError("the value schema must be a Connect struct with fields")
    try:
        return _required(schema, "")
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        if isinstance(error, SchemaConversionError):
            raise
        raise SchemaConversionError(f"not a Connect schema: {error!r}") from error


def _avro(schema: dict[str, Any], path: str) -> Any:
    converted = _required(schema, path)
    return ["null", converted] if schema.get("optional", False) else converted


def _required(schema: dict[str, Any], path: str) -> Any:
    kind, name = schema.get("type"), schema.get("name")
    parameters = schema.get("parameters") or {}
    where = path or "value"
    semantic = {"connect.name": name} if name else {}
    if name == CONNECT_DECIMAL:
        if kind != "bytes" or "scale" not in parameters:
            raise SchemaConversionError(
                f"{where}: a Connect Decimal must be bytes with a `scale` parameter ({schema})"
            )
        scale = int(parameters["scale"])
        # AvroConverter assumes 64 digits without the parameter; 38 is the most Iceberg holds, and
        # values that do not fit are dead-lettered (`conversion_failures_sql`).
        precision = int(parameters.get("connect.decimal.precision", ICEBERG_MAX_PRECISION))
        if precision > ICEBERG_MAX_PRECISION or not 0 <= scale <= precision:
            raise SchemaConversionError(
                f"{where}: decimal({precision}, {scale}) does not fit an Iceberg decimal (at most "
                "38 digits)"
            )
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": precision,
            "scale": scale,
            **semantic,
            "connect.parameters": parameters,
        }
    if name in _CONNECT_LOGICAL:
        connect_type, avro_type, logical = _CONNECT_LOGICAL[name]
        if kind != connect_type:
            raise SchemaConversionError(f"{where}: {name} must be {connect_type}, not {kind}")
        return {"type": avro_type, "logicalType": logical, **semantic}
    if kind in _PRIMITIVES:
        properties = {**semantic, **({"connect.type": kind} if kind in ("int8", "int16") else {})}
        return {"type": _PRIMITIVES[kind], **properties} if properties else _PRIMITIVES[kind]
    if kind == "struct":
        fields = schema["fields"]
        if not isinstance(fields, list):
            raise SchemaConversionError(f"{where}: a struct without a list of fields")
        namespace, _, short = (name or "ConnectDefault").rpartition(".")
        record: dict[str, Any] = {
            "type": "record",
            "name": short,
            **({"namespace": namespace} if namespace else {}),
            **semantic,
        }
        record["fields"] = [
            {
                "name": field["field"],
                "type": _avro(field, f"{path}.{field['field']}" if path else field["field"]),
            }
            for field in fields
        ]
        return record
    if kind == "array":
        return {"type": "array", "items": _avro(schema["items"], f"{where}[]"), **semantic}
    if kind == "map":
        if schema["keys"].get("type") != "string":
            # JsonConverter writes such maps as arrays of [key, value] pairs, which no Iceberg map
            # of this schema's types describes.
            raise SchemaConversionError(
                f"{where}: maps with {schema['keys'].get('type')} keys are not supported (only "
                "string keys)"
            )
        return {"type": "map", "values": _avro(schema["values"], f"{where}{{}}"), **semantic}
    raise SchemaConversionError(f"{where}: Connect type {kind!r} is not supported")


# -- how JSON carries the values -------------------------------------------------------------------


def json_carrier_type(avro_type: Any) -> T.DataType:
    """The Spark type `from_json` reads a value of `avro_type` into, as JsonConverter writes it.

    Bytes (and so decimals) arrive as base64 text, which `from_json` decodes into binary; text that
    is no base64 (or a decimal written as a number, `decimal.format=NUMERIC`) makes the record
    corrupt rather than null.
    """
    if isinstance(avro_type, list):
        return json_carrier_type(_non_null(avro_type))
    kind = avro_type.get("type") if isinstance(avro_type, dict) else avro_type
    if kind == "record":
        return T.StructType(
            [
                T.StructField(field["name"], json_carrier_type(field["type"]), True)
                for field in avro_type["fields"]
            ]
        )
    if kind == "array":
        return T.ArrayType(json_carrier_type(avro_type["items"]), True)
    if kind == "map":
        return T.MapType(T.StringType(), json_carrier_type(avro_type["values"]), True)
    simple = {
        "int": T.IntegerType(),
        "long": T.LongType(),
        "float": T.FloatType(),
        "double": T.DoubleType(),
        "boolean": T.BooleanType(),
        "string": T.StringType(),
        "bytes": T.BinaryType(),
    }
    if kind in simple:
        return simple[kind]
    raise SchemaConversionError(f"no JSON carrier for Avro type {avro_type!r}")


def avro_value_sql(value: str, avro_type: Any, depth: int = 0) -> str | None:
    """SQL turning JSON carrier `value` into what
    `from_avro` gives for `avro_type`; None when equal.

    Structs are rebuilt only where a field below them changes.
    """
    if isinstance(avro_type, list):
        return avro_value_sql(value, _non_null(avro_type), depth)
    if not isinstance(avro_type, dict):
        return None
    kind, logical = avro_type.get("type"), avro_type.get("logicalType")
    if kind == "bytes" and logical == "decimal":
        return connect_decimal_sql(value, int(avro_type["precision"]), int(avro_type["scale"]))
    if kind == "int" and logical == "date":
        return f"date_from_unix_date({value})"
    if kind == "long" and logical == "timestamp-millis":
        return (
            f"CASE WHEN abs({value}) <= {_MAX_TIMESTAMP_MILLIS} THEN timestamp_millis({value}) END"
        )
    if kind == "record":
        converted = {
            field["name"]: avro_value_sql(_field(value, field["name"]), field["type"], depth)
            for field in avro_type["fields"]
        }
        if all(expression is None for expression in converted.values()):
            return None
        fields = ", ".join(
            f"{sql.string(name)}, {expression if expression is not None else _field(value, name)}"
            for name, expression in converted.items()
        )
        return f"CASE WHEN {value} IS NULL THEN NULL ELSE named_struct({fields}) END"
    element = f"_ik_e{depth}"
    if kind == "array":
        item = avro_value_sql(element, avro_type["items"], depth + 1)
        return f"transform({value}, {element} -> {item})" if item is not None else None
    if kind == "map":
        item = avro_value_sql(element, avro_type["values"], depth + 1)
        return (
            f"transform_values({value}, (_ik_k{depth}, {element}) -> {item})"
            if item is not None
            else None
        )
    return None


def conversion_failures_sql(value: str, avro_type: Any, depth: int = 0) -> list[str]:
    """SQL conditions, each true where a non-null carrier under `value` did not convert."""
    if isinstance(avro_type, list):
        return conversion_failures_sql(value, _non_null(avro_type), depth)
    kind = avro_type.get("type") if isinstance(avro_type, dict) else avro_type
    if kind == "record":
        return [
            condition
            for field in avro_type["fields"]
            for condition in conversion_failures_sql(
                _field(value, field["name"]), field["type"], depth
            )
        ]
    element = f"_ik_e{depth}"
    if kind in ("array", "map"):
        inner = conversion_failures_sql(
            element, avro_type["items" if kind == "array" else "values"], depth + 1
        )
        collection = value if kind == "array" else f"map_values({value})"
        return [f"exists({collection}, {element} -> {sql.any_of(inner)})"] if inner else []
    converted = avro_value_sql(value, avro_type, depth)
    if converted is None or (
        isinstance(avro_type, dict) and avro_type.get("logicalType") == "date"
    ):
        return []  # unchanged, or total (every int is a day Spark can hold)
    return [f"({value} IS NOT NULL AND {converted} IS NULL)"]


def _field(value: str, name: str) -> str:
    """SQL for field `name` of struct `value` (a column path or a lambda variable)."""
    return f"{value}.{sql.ident(name)}"


def _non_null(union: list[Any]) -> Any:
    branches = [branch for branch in union if branch != "null"]
    if len(branches) != 1:
        raise SchemaConversionError(f"unions of several types are not supported ({union})")
    return branches[0]
