"""Debezium MySQL change events as Debezium's Avro converter shapes them.

The sample and synthetic producers describe a table as a list of row fields; this module wraps
them into the `Envelope` / `Key` / `Source` schemas Debezium 1.x-3.x registers, so our
writers meet the same structure as in production (seed 000's samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEBEZIUM_VERSION = "1.8.0.Final"


@dataclass(frozen=True)
class Column:
    """One table column: name, Avro type, whether NULL is allowed, Debezium logical name."""

    name: str
    avro_type: str | dict[str, Any]
    """An Avro primitive name, or a whole Avro type as Debezium registers it (decimals, structs)."""
    optional: bool = True
    connect_name: str | None = None

    def avro_field(self) -> dict[str, Any]:
        base: Any = (
            {"type": self.avro_type, "connect.version": 1, "connect.name": self.connect_name}
            if self.connect_name
            else self.avro_type
        )
        if self.optional:
            return {"name": self.name, "type": ["null", base], "default": None}
        return {"name": self.name, "type": base}


@dataclass(frozen=True)
class TableShape:
    """A table's columns at one schema version, and its key columns."""

    server: str
    db: str
    table: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    @property
    def topic(self) -> str:
        return f"{self.server}.{self.db}.{self.table}"

    def value_schema(self) -> dict[str, Any]:
        namespace = self.topic
        row = {
            "type": "record",
            "name": "Value",
            "namespace": namespace,
            "fields": [c.avro_field() for c in self.columns],
            "connect.name": f"{namespace}.Value",
        }
        return {
            "type": "record",
            "name": "Envelope",
            "namespace": namespace,
            "fields": [
                {"name": "before", "type": ["null", row], "default": None},
                {"name": "after", "type": ["null", f"{namespace}.Value"], "default": None},
                {"name": "source", "type": _SOURCE_SCHEMA},
                {"name": "op", "type": "string"},
                {"name": "ts_ms", "type": ["null", "long"], "default": None},
                {"name": "transaction", "type": ["null", _TRANSACTION_SCHEMA], "default": None},
            ],
            "connect.name": f"{namespace}.Envelope",
        }

    def key_schema(self) -> dict[str, Any]:
        by_name = {column.name: column for column in self.columns}
        fields = [
            Column(name, by_name[name].avro_type, optional=False).avro_field() for name in self.key
        ]
        return {
            "type": "record",
            "name": "Key",
            "namespace": self.topic,
            "fields": fields,
            "connect.name": f"{self.topic}.Key",
        }

    def key_of(self, row: dict[str, Any]) -> dict[str, Any]:
        return {name: row[name] for name in self.key}


_SOURCE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Source",
    "namespace": "io.debezium.connector.mysql",
    "fields": [
        {"name": "version", "type": "string"},
        {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {
            "name": "snapshot",
            "type": [
                {
                    "type": "string",
                    "connect.version": 1,
                    "connect.parameters": {"allowed": "true,last,false,incremental"},
                    "connect.default": "false",
                    "connect.name": "io.debezium.data.Enum",
                },
                "null",
            ],
            "default": "false",
        },
        {"name": "db", "type": "string"},
        {"name": "sequence", "type": ["null", "string"], "default": None},
        {"name": "table", "type": ["null", "string"], "default": None},
        {"name": "server_id", "type": "long"},
        {"name": "gtid", "type": ["null", "string"], "default": None},
        {"name": "file", "type": "string"},
        {"name": "pos", "type": "long"},
        {"name": "row", "type": "int"},
        {"name": "thread", "type": ["null", "long"], "default": None},
        {"name": "query", "type": ["null", "string"], "default": None},
    ],
    "connect.name": "io.debezium.connector.mysql.Source",
}

_TRANSACTION_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "ConnectDefault",
    "namespace": "io.confluent.connect.avro",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"},
    ],
}


@dataclass(frozen=True)
class BinlogPosition:
    """Where in the MySQL binlog an event came from (Debezium's `source` block)."""

    ts_ms: int
    file: str
    pos: int
    gtid: str


def envelope(
    shape: TableShape,
    op: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    at: BinlogPosition,
    envelope_ts_ms: int,
) -> dict[str, Any]:
    """A Debezium change event value: before/after rows, source block, op, ts_ms, transaction."""
    return {
        "before": before,
        "after": after,
        "source": {
            "version": DEBEZIUM_VERSION,
            "connector": "mysql",
            "name": shape.server,
            "ts_ms": at.ts_ms,
            "snapshot": "false",
            "db": shape.db,
            "sequence": None,
            "table": shape.table,
            "server_id": 1,
            "gtid": at.gtid,
            "file": at.file,
            "pos": at.pos,
            "row": 0,
            "thread": None,
            "query": None,
        },
        "op": op,
        "ts_ms": envelope_ts_ms,
        "transaction": {"id": at.gtid, "total_order": 1, "data_collection_order": 1},
    }


# -- Debezium JSON (Kafka Connect's JsonConverter) -------------------------------------------------

_CONNECT_PRIMITIVES = {
    "int": "int32",
    "long": "int64",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}


def connect_schema(avro_type: Any, optional: bool = False) -> dict[str, Any]:
    """The Kafka Connect schema JsonConverter (`schemas.enable=true`) writes beside a value that
    Debezium's Avro converter would register as `avro_type` (records, optional unions, primitives,
    Connect names and parameters; named-type references must be inlined,
    `common.schema.resolve_named_types`)."""
    if isinstance(avro_type, list):
        branches = [branch for branch in avro_type if branch != "null"]
        if len(branches) != 1:
            raise ValueError(f"no Connect schema for the union {avro_type}")
        return connect_schema(branches[0], optional=len(branches) < len(avro_type))
    if isinstance(avro_type, str):
        return {"type": _CONNECT_PRIMITIVES[avro_type], "optional": optional}
    described: dict[str, Any] = {"optional": optional}
    if "connect.name" in avro_type:
        described.update(
            {
                "name": avro_type["connect.name"],
                **(
                    {"version": avro_type["connect.version"]}
                    if "connect.version" in avro_type
                    else {}
                ),
            }
        )
    if "connect.parameters" in avro_type:
        described["parameters"] = avro_type["connect.parameters"]
    kind = avro_type["type"]
    if kind == "record":
        return {
            "type": "struct",
            "fields": [
                {**connect_schema(field["type"]), "field": field["name"]}
                for field in avro_type["fields"]
            ],
            **described,
        }
    if avro_type.get("logicalType") == "decimal":
        parameters = {
            "scale": str(avro_type["scale"]),
            "connect.decimal.precision": str(avro_type["precision"]),
        }
        return {
            "type": "bytes",
            "optional": optional,
            "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": parameters,
        }
    return {**connect_schema(kind), **described}
