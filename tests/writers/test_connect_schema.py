"""Kafka Connect JSON schemas give a table the same columns as the Avro schema Connect registers
for the same source table (writers/connect_schema.py), without services."""

from __future__ import annotations

import pytest

from icekeeper.common.schema import (
    SchemaConversionError,
    envelope_shape,
    resolve_named_types,
    row_columns,
)
from icekeeper.samples.debezium import Column, TableShape
from icekeeper.writers.connect_schema import avro_from_connect, avro_value_sql, is_connect_struct
from tests.support.connect_json import TYPES_ROW, decimal_field, envelope_schema, field

DECIMAL_10_2 = {
    "type": "bytes",
    "scale": 2,
    "precision": 10,
    "connect.version": 1,
    "logicalType": "decimal",
    "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
    "connect.name": "org.apache.kafka.connect.data.Decimal",
}
AVRO_COLUMNS = (
    Column("id", "int", optional=False),
    Column("small", {"type": "int", "connect.type": "int16"}),
    Column("big", "long"),
    Column("amount", DECIMAL_10_2),
    Column("payload", "bytes"),
    Column("d", "int", connect_name="io.debezium.time.Date"),
    Column("dt6", "long", connect_name="io.debezium.time.MicroTimestamp"),
    Column("ts", "string", connect_name="io.debezium.time.ZonedTimestamp"),
    Column("t", "long", connect_name="io.debezium.time.MicroTime"),
    Column("doc", "string", connect_name="io.debezium.data.Json"),
    Column("name", "string"),
)
"""The same MariaDB table as Debezium's Avro converter registers it."""


def test_a_connect_schema_gives_the_columns_of_the_avro_schema_connect_registers() -> None:
    from_json = row_columns(
        envelope_shape(avro_from_connect(envelope_schema("s", "shop", "types", TYPES_ROW)))
    )
    avro = TableShape(
        server="s", db="shop", table="types", columns=AVRO_COLUMNS, key=("id",)
    ).value_schema()
    from_avro = row_columns(envelope_shape(resolve_named_types(avro)))
    assert [(c.name, str(c.type), c.semantic) for c in from_json] == [
        (c.name, str(c.type), c.semantic) for c in from_avro
    ]


def test_connect_logical_types_map_as_avro_converter_maps_them() -> None:
    row = [
        field("id", "int8", optional=False),
        field("day", "int32", semantic="org.apache.kafka.connect.data.Date"),
        field("at", "int64", semantic="org.apache.kafka.connect.data.Timestamp"),
        field("tod", "int32", semantic="org.apache.kafka.connect.data.Time"),
    ]
    columns = row_columns(envelope_shape(avro_from_connect(envelope_schema("s", "shop", "t", row))))
    assert {c.name: str(c.type) for c in columns} == {
        "id": "int",
        "day": "date",
        "at": "timestamptz",
        "tod": "string",
    }


def test_arrays_and_maps_get_the_columns_of_their_avro_twins() -> None:
    row = [
        field("id", "int32", optional=False),
        {
            "type": "array",
            "items": {"type": "bytes", "optional": True},
            "optional": True,
            "field": "blobs",
        },
        {
            "type": "map",
            "keys": {"type": "string", "optional": False},
            "values": {"type": "float", "optional": True},
            "optional": True,
            "field": "scores",
        },
    ]
    twins = (
        Column("id", "int", optional=False),
        Column("blobs", {"type": "array", "items": ["null", "bytes"]}),
        Column("scores", {"type": "map", "values": ["null", "float"]}),
    )
    from_json = row_columns(
        envelope_shape(avro_from_connect(envelope_schema("s", "shop", "t", row)))
    )
    from_avro = row_columns(
        envelope_shape(
            resolve_named_types(
                TableShape(
                    server="s", db="shop", table="t", columns=twins, key=("id",)
                ).value_schema()
            )
        )
    )
    assert [(c.name, str(c.type), c.semantic) for c in from_json] == [
        (c.name, str(c.type), c.semantic) for c in from_avro
    ]


@pytest.mark.parametrize(
    ("row_field", "reason"),
    [
        (
            decimal_field("num", 65, 30),
            "before.num: decimal(65, 30) does not fit an Iceberg decimal (at most 38 digits)",
        ),
        (
            {
                "type": "map",
                "keys": {"type": "int32"},
                "values": {"type": "string"},
                "optional": True,
                "field": "m",
            },
            "before.m: maps with int32 keys are not supported (only string keys)",
        ),
        (field("x", "int128"), "before.x: Connect type 'int128' is not supported"),
    ],
)
def test_a_schema_no_iceberg_table_can_take_is_refused_with_the_field_and_why(
    row_field: dict, reason: str
) -> None:
    with pytest.raises(SchemaConversionError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        avro_from_connect(
            envelope_schema("s", "shop", "t", [field("id", "int32", optional=False), row_field])
        )


def test_a_schema_without_field_types_is_no_connect_struct() -> None:
    assert not is_connect_struct(None) and not is_connect_struct(
        {"type": "struct", "name": "envelope"}
    )
    assert is_connect_struct(envelope_schema("s", "shop", "t", [field("id", "int32")]))


def test_structs_are_rebuilt_only_where_a_value_changes() -> None:
    plain = avro_from_connect(
        envelope_schema("s", "shop", "t", [field("id", "int32"), field("name", "string")])
    )
    assert avro_value_sql("p", plain) is None
    with_bytes = avro_from_connect(
        envelope_schema("s", "shop", "t", [field("id", "int32"), field("blob", "bytes")])
    )
    assert avro_value_sql("p", with_bytes) is None  # `from_json` decodes base64 into binary itself
    with_decimal = avro_from_connect(
        envelope_schema("s", "shop", "t", [field("id", "int32"), decimal_field("amount", 10, 2)])
    )
    assert "AS DECIMAL(10, 2)" in avro_value_sql("p", with_decimal)
