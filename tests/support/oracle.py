"""Compare an Iceberg changelog table with the source database's `SELECT *`, through every engine.

The oracle tests run real statements against MariaDB or PostgreSQL, stream them through
Debezium, the writer and the bookkeeper, and then check what a user would: the latest row of
every live key equals the database's row, column by column and with the right types, read by
pyiceberg, DuckDB and Spark alike; and every Kafka record is in exactly one place.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any, Callable, Iterable

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyiceberg.table import Table

UTC = dt.timezone.utc


def time_text(value: dt.timedelta) -> str:
    """A MariaDB TIME as the table holds it: `[-]HH:MM:SS[.ffffff]` (docs/types.md)."""
    micros = value // dt.timedelta(microseconds=1)
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    seconds, fraction = divmod(micros, 1_000_000)
    text = f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return text + (f".{fraction:06d}" if fraction else "")


def latest_live_rows(changelog: Iterable[dict[str, Any]], key: list[str]) -> dict[tuple, dict[str, Any]]:
    """The last change of each key, in Kafka order, leaving out keys whose last change is a delete.

    Debezium keys its records by primary key, so all changes of a key sit in one partition.
    """
    last: dict[tuple, dict[str, Any]] = {}
    partitions: dict[tuple, int] = {}
    for row in sorted(changelog, key=lambda r: (r["_kfk_partition"], r["_kfk_offset"])):
        identity = tuple(row[name] for name in key)
        assert partitions.setdefault(identity, row["_kfk_partition"]) == row["_kfk_partition"], f"key {identity} in two partitions"
        last[identity] = row
    return {identity: row for identity, row in last.items() if row["_src_op"] != "d"}


def normalized(value: Any, iceberg_type: str) -> Any:
    """One engine's value in one form: aware UTC for timestamptz, bytes for binary."""
    if value is None:
        return None
    if iceberg_type == "timestamptz" and isinstance(value, dt.datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if iceberg_type.startswith("decimal") and not isinstance(value, Decimal):
        return Decimal(str(value))
    return value


def engine_rows(table: Table, spark_reader: Callable[[str], list[dict[str, Any]]], duckdb_reader: Callable[[Table], list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The table's rows as pyiceberg, DuckDB and Spark read them, values normalized by Iceberg type."""
    types = {field.name: str(field.field_type) for field in table.schema().fields}
    raw = {"pyiceberg": table.scan().to_arrow().to_pylist(), "duckdb": duckdb_reader(table), "spark": spark_reader("*")}
    return {engine: [{name: normalized(row[name], types[name]) for name in types} for row in rows] for engine, rows in raw.items()}


def position(row: dict[str, Any]) -> tuple[str, int, int]:
    return (row["_kfk_topic"], row["_kfk_partition"], row["_kfk_offset"])


def topic_records(bootstrap_servers: str, topics: list[str]) -> int:
    """Records in `topics` (none was ever deleted: retention is off on the test stack)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    metadata = admin.list_topics(timeout=10)
    partitions = [TopicPartition(topic, p) for topic in topics for p in metadata.topics[topic].partitions]
    latest = admin.list_offsets({tp: OffsetSpec.latest() for tp in partitions}, request_timeout=10)
    return sum(future.result().offset for future in latest.values())
