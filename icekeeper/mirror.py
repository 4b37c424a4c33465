"""An Iceberg changelog table as a mirror of its
source table: the latest live row per key, compared.

icekeeper's tables are changelogs: one row per Debezium record, with `_src_op` and the Kafka
position (`_kfk_partition`, `_kfk_offset`) beside the columns. The source table's current state
is the last change of each primary key, in Kafka order, for keys whose last change is not a
delete. `icekeeper demo --source mariadb` and the oracle tests (`tests/support/oracle.py`)
compute that state here and compare it with the database's `SELECT *`, after bringing both
sides' values into one form: the one docs/types.md gives for the Iceberg type.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pyiceberg.table import Table

UTC = dt.UTC

Key = tuple
Row = dict[str, Any]


def time_text(value: dt.timedelta) -> str:
    """A MariaDB TIME as the table holds it: `[-]HH:MM:SS[.ffffff]` (docs/types.md)."""
    micros = value // dt.timedelta(microseconds=1)
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    seconds, fraction = divmod(micros, 1_000_000)
    text = f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return text + (f".{fraction:06d}" if fraction else "")


def latest_live_rows(changelog: Iterable[Row], key: list[str]) -> dict[Key, Row]:
    """The last change of each key, in Kafka order, leaving out keys whose last change is a delete.

    Debezium keys its records by primary key, so all changes of a key sit in one partition and
    the offset orders them.

    Raises:
        ValueError: a key has rows in two partitions (then no order between them is known).
    """
    last: dict[Key, Row] = {}
    partitions: dict[Key, int] = {}
    for row in sorted(changelog, key=lambda r: (r["_kfk_partition"], r["_kfk_offset"])):
        identity = tuple(row[name] for name in key)
        if partitions.setdefault(identity, row["_kfk_partition"]) != row["_kfk_partition"]:
            raise ValueError(
                f"key {identity} in partitions {partitions[identity]} and {row['_kfk_partition']}"
            )
        last[identity] = row
    return {identity: row for identity, row in last.items() if row["_src_op"] != "d"}


def rows_by_key(rows: Iterable[Row], key: list[str]) -> dict[Key, Row]:
    """An upsert table's rows by key, as read: no deduplication.

    Raises:
        ValueError: a key has two live rows (the table is not a mirror).
    """
    found: dict[Key, Row] = {}
    for row in rows:
        identity = tuple(row[name] for name in key)
        if identity in found:
            raise ValueError(f"key {identity} has two live rows")
        found[identity] = row
    return found


def normalized(value: Any, iceberg_type: str) -> Any:
    """One engine's value in one form: aware UTC for
    timestamptz, bytes for binary, Decimal for decimals."""
    if value is None:
        return None
    if iceberg_type == "timestamptz" and isinstance(value, dt.datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if iceberg_type.startswith("decimal") and not isinstance(value, Decimal):
        return Decimal(str(value))
    return value


def source_value(value: Any, iceberg_type: str) -> Any:
    """A value as a MariaDB/MySQL driver returns it, in the form the table holds it (docs/types.md).

    TIME arrives as a `timedelta` and is text in the table; TIMESTAMP arrives naive, in the
    session's time zone: read it in a session with `time_zone = '+00:00'`.
    """
    if isinstance(value, dt.timedelta):
        return time_text(value)
    return normalized(value, iceberg_type)


def iceberg_types(table: Table) -> dict[str, str]:
    """Each column's Iceberg type as text (`int`,
    `decimal(10, 2)`, `timestamptz`), in schema order."""
    return {field.name: str(field.field_type) for field in table.schema().fields}


def engine_rows(
    table: Table,
    spark_reader: Callable[[str], list[Row]],
    duckdb_reader: Callable[[Table], list[Row]],
) -> dict[str, list[Row]]:
    """The table's rows as pyiceberg, DuckDB and Spark read them, values normalized by Iceberg type.

    Args:
        table: the table, as loaded from the catalog.
        spark_reader: reads the given columns through Spark SQL (`icekeeper.readers.spark_rows`).
        duckdb_reader: reads the table through DuckDB (`icekeeper.readers.duckdb_rows`).
    """
    types = iceberg_types(table)
    raw = {
        "pyiceberg": table.scan().to_arrow().to_pylist(),
        "duckdb": duckdb_reader(table),
        "spark": spark_reader("*"),
    }
    return {
        engine: [{name: normalized(row[name], types[name]) for name in types} for row in rows]
        for engine, rows in raw.items()
    }


@dataclass(frozen=True)
class Difference:
    """One way the table's latest live rows differ from the source's rows."""

    key: Key
    column: str | None
    """The differing column; None when the key is on one side only."""
    description: str

    def __str__(self) -> str:
        return f"key {', '.join(str(part) for part in self.key)}: {self.description}"


def differences(source: Mapping[Key, Row], mirror: Mapping[Key, Row]) -> list[Difference]:
    """What differs between the source's rows and the table's latest live rows, keyed alike.

    Only the source's columns are compared (the table adds metadata columns, and keeps columns
    the source dropped). Returns one difference per key missing on either side and per differing
    column, ordered by key; empty when the two are equal.
    """
    found = []
    for identity in ordered_keys(set(source) | set(mirror)):
        if identity not in mirror:
            found.append(Difference(identity, None, "in the source, not in the table"))
        elif identity not in source:
            found.append(Difference(identity, None, "in the table, not in the source"))
        else:
            mirror_row = mirror[identity]
            for column, value in source[identity].items():
                if column not in mirror_row:
                    found.append(
                        Difference(identity, column, f"column {column} is not in the table")
                    )
                elif mirror_row[column] != value:
                    found.append(
                        Difference(
                            identity,
                            column,
                            f"{column}: source {value!r}, table {mirror_row[column]!r}",
                        )
                    )
    return found


def ordered_keys(keys: Iterable[Key]) -> list[Key]:
    """Keys in their natural order, or by their text
    where parts do not compare (None, mixed types)."""
    try:
        return sorted(keys)
    except TypeError:
        return sorted(keys, key=repr)
