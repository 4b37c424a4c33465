"""Debezium's semantic types with edge values: the columns Debezium's MariaDB connector registers
for DATE, DATETIME(3), DATETIME(6), TIMESTAMP, TIME, DECIMAL, JSON, ENUM, SET, BIT and GEOMETRY,
plus PostgreSQL's NUMERIC without scale and UUID, the carrier values it sends, and the Iceberg rows
they must become (docs/types.md has the table)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from icekeeper.samples.debezium import Column
from tests.support.carriers import UTC, days, micros, time_micros


def two_complement(value: int) -> bytes:
    return value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)


DECIMAL_10_2 = {
    "type": "bytes",
    "scale": 2,
    "precision": 10,
    "connect.version": 1,
    "logicalType": "decimal",
    "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
    "connect.name": "org.apache.kafka.connect.data.Decimal",
}


DECIMAL_65_30 = {
    **DECIMAL_10_2,
    "scale": 30,
    "precision": 65,
    "connect.parameters": {"scale": "30", "connect.decimal.precision": "65"},
}


VARIABLE_SCALE = {
    "type": "record",
    "name": "VariableScaleDecimal",
    "namespace": "io.debezium.data",
    "connect.version": 1,
    "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
    "connect.name": "io.debezium.data.VariableScaleDecimal",
}


GEOMETRY = {
    "type": "record",
    "name": "Geometry",
    "namespace": "io.debezium.data.geometry",
    "connect.version": 1,
    "fields": [
        {"name": "wkb", "type": "bytes"},
        {"name": "srid", "type": ["null", "int"], "default": None},
    ],
    "connect.name": "io.debezium.data.geometry.Geometry",
}


COLUMNS = (
    Column("id", "int", optional=False),
    Column("d", "int", connect_name="io.debezium.time.Date"),
    Column("dt3", "long", connect_name="io.debezium.time.Timestamp"),
    Column("dt6", "long", connect_name="io.debezium.time.MicroTimestamp"),
    Column("ts", "string", connect_name="io.debezium.time.ZonedTimestamp"),
    Column("t", "long", connect_name="io.debezium.time.MicroTime"),
    Column("amount", DECIMAL_10_2),
    Column("huge", DECIMAL_65_30),
    Column("big", VARIABLE_SCALE),
    Column("doc", "string", connect_name="io.debezium.data.Json"),
    Column("color", "string", connect_name="io.debezium.data.Enum"),
    Column("tags", "string", connect_name="io.debezium.data.EnumSet"),
    Column("flags", "bytes", connect_name="io.debezium.data.Bits"),
    Column("shape", GEOMETRY),
    Column("ref", "string", connect_name="io.debezium.data.Uuid"),
    Column("note", "string"),
)


POINT_WKB = bytes.fromhex("0101000000000000000000f03f0000000000000040")


# (carrier values sent by Debezium, what the Iceberg row must hold)
CASES = [
    (
        {
            "id": 1,
            "d": days(dt.date(1000, 1, 1)),
            "dt3": micros(dt.datetime(1000, 1, 1, 0, 0, 0, 123000)) // 1000,
            "dt6": micros(dt.datetime(1969, 12, 31, 23, 59, 59, 999999)),
            "ts": "1970-01-01T00:00:00Z",
            "t": time_micros(838, 59, 59, negative=True),
            "amount": Decimal("-12345678.90"),
            "huge": Decimal("123.45"),
            "big": {"scale": 3, "value": two_complement(-1234567)},
            "doc": '{"a": [1, "中文", "😀"]}',
            "color": "red",
            "tags": "a,b",
            "flags": b"\x05",
            "shape": {"wkb": POINT_WKB, "srid": 4326},
            "ref": "5f0c6f5e-3b54-4a8e-9a55-0d7bb1f0a0c1",
            "note": "中文 😀",
        },
        {
            "id": 1,
            "d": dt.date(1000, 1, 1),
            "dt3": dt.datetime(1000, 1, 1, 0, 0, 0, 123000),
            "dt6": dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
            "ts": dt.datetime(1970, 1, 1, tzinfo=UTC),
            "t": "-838:59:59",
            "amount": Decimal("-12345678.90"),
            "huge": "123.450000000000000000000000000000",
            "big": "-1234.567",
            "doc": '{"a": [1, "中文", "😀"]}',
            "color": "red",
            "tags": "a,b",
            "flags": b"\x05",
            "shape": POINT_WKB,
            "ref": "5f0c6f5e-3b54-4a8e-9a55-0d7bb1f0a0c1",
            "note": "中文 😀",
        },
    ),
    (
        {
            "id": 2,
            "d": days(dt.date(9999, 12, 31)),
            "dt3": micros(dt.datetime(9999, 12, 31, 23, 59, 59, 999000)) // 1000,
            "dt6": micros(dt.datetime(2024, 2, 29, 12, 34, 56, 789012)),
            "ts": "2024-02-29T12:34:56.789012Z",
            "t": time_micros(838, 59, 59, 500000),
            "amount": Decimal("0.01"),
            "huge": Decimal("-1E-30"),
            "big": {"scale": 0, "value": two_complement(10**30)},
            "doc": "[]",
            "color": "",
            "tags": "",
            "flags": b"",
            "shape": None,
            "ref": None,
            "note": "",
        },
        {
            "id": 2,
            "d": dt.date(9999, 12, 31),
            "dt3": dt.datetime(9999, 12, 31, 23, 59, 59, 999000),
            "dt6": dt.datetime(2024, 2, 29, 12, 34, 56, 789012),
            "ts": dt.datetime(2024, 2, 29, 12, 34, 56, 789012, tzinfo=UTC),
            "t": "838:59:59.500000",
            "amount": Decimal("0.01"),
            "huge": "-0.000000000000000000000000000001",
            "big": "1" + "0" * 30,
            "doc": "[]",
            "color": "",
            "tags": "",
            "flags": b"",
            "shape": None,
            "ref": None,
            "note": "",
        },
    ),
    (
        {
            "id": 3,
            "d": None,
            "dt3": None,
            "dt6": None,
            "ts": None,
            "t": time_micros(12, 0, 0, 1),
            "amount": None,
            "huge": None,
            "big": {"scale": 5, "value": two_complement(1)},
            "doc": None,
            "color": None,
            "tags": None,
            "flags": None,
            "shape": None,
            "ref": None,
            "note": None,
        },
        {
            "id": 3,
            "d": None,
            "dt3": None,
            "dt6": None,
            "ts": None,
            "t": "12:00:00.000001",
            "amount": None,
            "huge": None,
            "big": "0.00001",
            "doc": None,
            "color": None,
            "tags": None,
            "flags": None,
            "shape": None,
            "ref": None,
            "note": None,
        },
    ),
]


UNCONVERTIBLE = [
    {**CASES[0][0], "id": 4, "ts": "infinity"},
    {**CASES[0][0], "id": 5, "huge": Decimal(10) ** 20},
]
"""PostgreSQL's `infinity` is no timestamp, and 10^20 at scale 30 has 51 digits: both records go to
the dead-letter topic, named, not null."""
