"""Kafka Connect schemas and Debezium events as JsonConverter writes them (`schemas.enable=true`),
shaped as Debezium 3.5's MariaDB connector writes them (captured from the stack's connector)."""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Any


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def connect_decimal(value: Decimal, scale: int) -> str:
    """JsonConverter's Decimal (decimal.format=BASE64): the
    unscaled big-endian two's complement, in base64."""
    unscaled = int(value.scaleb(scale))
    return b64(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True))


def field(
    name: str,
    kind: str,
    optional: bool = True,
    semantic: str | None = None,
    parameters: dict[str, str] | None = None,
) -> dict[str, Any]:
    described: dict[str, Any] = {"type": kind, "optional": optional}
    if semantic:
        described.update({"name": semantic, "version": 1})
    if parameters:
        described["parameters"] = parameters
    return {**described, "field": name}


def decimal_field(name: str, precision: int, scale: int) -> dict[str, Any]:
    return field(
        name,
        "bytes",
        semantic="org.apache.kafka.connect.data.Decimal",
        parameters={"scale": str(scale), "connect.decimal.precision": str(precision)},
    )


SOURCE_FIELDS = [
    field("version", "string", False),
    field("connector", "string", False),
    field("name", "string", False),
    field("ts_ms", "int64", False),
    {
        **field(
            "snapshot",
            "string",
            semantic="io.debezium.data.Enum",
            parameters={
                "allowed": "true,first,first_in_data_collection,last_in_data_collection,last,"
                "false,incremental"
            },
        ),
        "default": "false",
    },
    field("db", "string", False),
    field("sequence", "string"),
    field("ts_us", "int64"),
    field("ts_ns", "int64"),
    field("table", "string"),
    field("server_id", "int64", False),
    field("gtid", "string"),
    field("file", "string", False),
    field("pos", "int64", False),
    field("row", "int32", False),
    field("thread", "int64"),
    field("query", "string"),
]


def envelope_schema(
    server: str, db: str, table: str, row_fields: list[dict[str, Any]]
) -> dict[str, Any]:
    row = {
        "type": "struct",
        "fields": row_fields,
        "optional": True,
        "name": f"{server}.{db}.{table}.Value",
    }
    return {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {
                "type": "struct",
                "fields": SOURCE_FIELDS,
                "optional": False,
                "name": "io.debezium.connector.mariadb.Source",
                "version": 1,
                "field": "source",
            },
            {
                "type": "struct",
                "fields": [
                    field("id", "string", False),
                    field("total_order", "int64", False),
                    field("data_collection_order", "int64", False),
                ],
                "optional": True,
                "name": "event.block",
                "version": 1,
                "field": "transaction",
            },
            field("op", "string", False),
            field("ts_ms", "int64"),
            field("ts_us", "int64"),
            field("ts_ns", "int64"),
        ],
        "optional": False,
        "name": f"{server}.{db}.{table}.Envelope",
        "version": 2,
    }


def event(
    server: str,
    db: str,
    table: str,
    op: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    index: int,
) -> dict[str, Any]:
    """A Debezium change event's payload (MariaDB connector, binlog position `index`)."""
    ts_ms = 1_767_225_600_000 + index
    source = {
        "version": "3.5.0.Final",
        "connector": "mariadb",
        "name": server,
        "ts_ms": ts_ms,
        "snapshot": "false",
        "db": db,
        "sequence": None,
        "ts_us": ts_ms * 1000,
        "ts_ns": ts_ms * 1_000_000,
        "table": table,
        "server_id": 1,
        "gtid": f"0-1-{index}",
        "file": "mariadb-bin.000002",
        "pos": 4 + index,
        "row": 0,
        "thread": None,
        "query": None,
    }
    return {
        "before": before,
        "after": after,
        "source": source,
        "transaction": None,
        "op": op,
        "ts_ms": ts_ms + 5,
        "ts_us": (ts_ms + 5) * 1000,
        "ts_ns": (ts_ms + 5) * 1_000_000,
    }


# MariaDB's types as the connector describes a row of them.
TYPES_ROW = [
    field("id", "int32", optional=False),
    field("small", "int16"),
    field("big", "int64"),
    decimal_field("amount", 10, 2),
    field("payload", "bytes"),
    field("d", "int32", semantic="io.debezium.time.Date"),
    field("dt6", "int64", semantic="io.debezium.time.MicroTimestamp"),
    field("ts", "string", semantic="io.debezium.time.ZonedTimestamp"),
    field("t", "int64", semantic="io.debezium.time.MicroTime"),
    field("doc", "string", semantic="io.debezium.data.Json"),
    field("name", "string"),
]
