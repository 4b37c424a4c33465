"""Key columns: a table's primary key as its rows spell it, and a delete's key from its record key.

A table's primary key is written in the config as its user spells it (seed 000 wrote `id1,id2`
for `ID1`, `ID2`); `resolve_keys` finds each key column in the table's columns, ignoring case
where the spelling differs. Both engines key upsert tables and check `missing-key` by it.

A delete without a `before` image takes its key columns from the Kafka record key. Debezium keys
every record by the table's primary key: a struct, as Confluent-framed Avro (subject
`<topic>-key`) or as JSON with or without Kafka Connect's schema/payload envelope. Some connectors
and JSON producers send a delete with only that key (`before: null`), which on its own would give a
row without key columns, and so a delete of nothing. Each engine reads such a delete's record key
as the version's primary-key columns (the key's fields matched to them by name), typed as the row
types them (`spark_sql_engine/sql_record_keys.py`, `arrow_engine/arrow_record_keys.py`); this
module holds what they share: which columns a key gives (`RecordKeys`) and, for Avro keys, the
writer and reader schemas that read a key as those columns (`avro_key_schemas`).

Invariants:
- Only deletes without a `before` image read their key; other records never decode theirs.
- Only primary-key columns are read from keys. Besides meaning, this keeps `spark-sql`'s
  generated code small: the writer's main stage is one generated Java method, and past 8,000
  bytes of bytecode HotSpot stops compiling it (`DontCompileHugeMethods`): with the whole row
  read from keys, the bench table's stage grew from 5.8 kB to 8.1 kB and the writer ran ~2.5x
  slower (measured).
- A key that cannot be read as the row gives null key columns, never a guess: such a delete is
  dead-lettered as `delete-without-key`, as is a delete without a record key.

Avro keys are decoded with their own (writer) schema and the version's key columns, made
nullable, as the reader schema: Avro's schema resolution matches fields by name and promotes
int to long. A key schema is used for a version only if each of its fields that the row has can
be resolved to the row's type, so a decoder never meets an unresolvable pair. A primitive key (a
bare long or string rather than a record or object) is the value of a one-column primary key.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from icekeeper.common.config.model import TableSpec
from icekeeper.writers.registry import RegisteredSchema

_PROMOTIONS = {
    ("int", "long"),
    ("int", "float"),
    ("int", "double"),
    ("long", "float"),
    ("long", "double"),
    ("float", "double"),
    ("string", "bytes"),
    ("bytes", "string"),
}
"""Avro's schema resolution: (writer type, reader type) pairs it converts besides equal types."""


@dataclass(frozen=True)
class UpsertRule:
    """How an upsert table keeps one row per key of a batch: each key's last change in Kafka
    offset order; a last change that deletes its key goes to a deleted-keys file. Planned by the
    core (`table_batch.py`), applied by the engines: here, not there, so that the arrow engine's
    executor tasks, which get one in their plan, do not import the core's planning (and with it
    pyiceberg's catalog, ~140 modules, in every fresh Python worker)."""

    key_columns: tuple[str, ...]
    """The primary-key columns as the table's schema spells them (`resolve_keys`)."""
    op_column: str | None
    """The op column deciding which last changes delete their key (op `d`); None when deletes
    keep their row (`delete_mode: soft`) or the table has no op column."""


@dataclass(frozen=True)
class RecordKeys:
    """How one source's record keys are read for deletes without a `before` image."""

    columns: tuple[str, ...]
    """The primary-key columns of the source's keyed tables, as the config spells them (matched
    to a row's columns ignoring case, as `resolve_keys` does): all that keys give."""
    single_column: str | None = None
    """The primary-key column a primitive key stands for: set when every keyed table of the source
    has this one key column."""
    avro_schemas: tuple[RegisteredSchema, ...] = ()
    """The Avro key schemas known so far; a key's frame names its schema by id."""


def record_keys_for(
    tables: Iterable[TableSpec], avro_schemas: Iterable[RegisteredSchema] = ()
) -> RecordKeys | None:
    """How keys are read for a source's `tables`; None
    when no table has a primary key (keys unread)."""
    keyed = [table.primary_key for table in tables if table.primary_key]
    if not keyed:
        return None
    columns = list({name.lower(): name for key in keyed for name in key}.values())
    single = len(columns) == 1 and all(len(key) == 1 for key in keyed)
    return RecordKeys(tuple(columns), columns[0] if single else None, tuple(avro_schemas))


def resolve_keys(names: list[str], primary_key: list[str]) -> list[str]:
    """Key columns as the schema spells them (seed 000 wrote `id1,id2` for `ID1`, `ID2`).

    Raises:
        ValueError: a key column matches none of `names`, or several ignoring case.
    """
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


def row_column_name(row_names: Iterable[str], column: str | None) -> str | None:
    """The row's spelling of `column` (exact, else the one match ignoring case), or None."""
    names = list(row_names)
    if column is None or column in names:
        return column
    matches = [name for name in names if name.lower() == column.lower()]
    return matches[0] if len(matches) == 1 else None


def key_columns_of(row_names: Iterable[str], keys: RecordKeys) -> list[str]:
    """The key columns a row has, as it spells them, in the row's order."""
    wanted = {
        name
        for column in keys.columns
        if (name := row_column_name(list(row_names), column)) is not None
    }
    return [name for name in row_names if name in wanted]


# -- Avro keys -------------------------------------------------------------------------------------


def avro_key_schemas(
    row: dict[str, Any], key_schema: Any, keys: RecordKeys
) -> tuple[str, str] | None:
    """(writer, reader) schema texts that read a key of `key_schema` as `row`'s key columns; None
    when they cannot (no key column in the row or the key, or a type Avro cannot resolve).

    Args:
        row: the version's row record (Spark-decodable, as the value is decoded).
        key_schema: the key's registered schema (Spark-decodable).
    """
    columns = key_columns_of([field["name"] for field in row["fields"]], keys)
    key_row = {**row, "fields": [field for field in row["fields"] if field["name"] in columns]}
    if _kind(key_schema) == "record":
        writer = key_schema
    else:
        column = row_column_name(columns, keys.single_column)
        if column is None:
            return None
        # A record of one field is encoded exactly as the field's value: the same bytes.
        writer = {
            "type": "record",
            "name": "PrimitiveKey",
            "fields": [{"name": column, "type": key_schema}],
        }
    row_types = {field["name"]: field["type"] for field in key_row["fields"]}
    shared = [field for field in writer["fields"] if field["name"] in row_types]
    if not shared or not all(
        _resolvable(field["type"], row_types[field["name"]]) for field in shared
    ):
        return None
    return json.dumps(writer), json.dumps(_nullable_row(key_row))


def row_record(envelope_schema: Any) -> dict[str, Any] | None:
    """The row record a Debezium envelope schema defines (in `before`, else `after`), standalone."""
    if not isinstance(envelope_schema, dict) or envelope_schema.get("type") != "record":
        return None
    fields = {field["name"]: field["type"] for field in envelope_schema["fields"]}
    for name in ("before", "after"):
        branches = fields.get(name)
        for branch in branches if isinstance(branches, list) else [branches]:
            if isinstance(branch, dict) and branch.get("type") == "record":
                row = copy.deepcopy(branch)
                # Nested in the envelope, the row inherits
                # its namespace; standalone it must name it.
                if (
                    "namespace" not in row
                    and "." not in row["name"]
                    and envelope_schema.get("namespace")
                ):
                    row["namespace"] = envelope_schema["namespace"]
                return row
    return None


def _nullable_row(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with every field optional (null first,
    default null): a field the key lacks reads as null."""
    fields = []
    for field in row["fields"]:
        branches = field["type"] if isinstance(field["type"], list) else [field["type"]]
        fields.append(
            {
                **{k: v for k, v in field.items() if k != "default"},
                "type": ["null", *[b for b in branches if b != "null"]],
                "default": None,
            }
        )
    return {**row, "fields": fields}


def _kind(avro_type: Any) -> str | None:
    if isinstance(avro_type, str):
        return avro_type
    if isinstance(avro_type, dict):
        inner = avro_type.get("type")
        return inner if isinstance(inner, str) else _kind(inner)
    return None


def _resolvable(writer: Any, reader: Any) -> bool:
    """True when Avro resolves a `writer` value into
    `reader` (nulls aside); complex types must be equal."""
    writer, reader = _non_null(writer), _non_null(reader)
    if writer is None or reader is None:
        return False
    kinds = (_kind(writer), _kind(reader))
    if kinds[0] in ("record", "enum", "fixed", "array", "map") or kinds[1] in (
        "record",
        "enum",
        "fixed",
        "array",
        "map",
    ):
        return json.dumps(writer, sort_keys=True) == json.dumps(reader, sort_keys=True)
    if _logical(writer) != _logical(reader):
        return False
    return kinds[0] == kinds[1] or kinds in _PROMOTIONS


def _logical(avro_type: Any) -> tuple:
    """What a logical type makes of the bytes (a decimal's scale, say), which resolution ignores."""
    return (
        tuple(avro_type.get(name) for name in ("logicalType", "precision", "scale"))
        if isinstance(avro_type, dict)
        else (None, None, None)
    )


def _non_null(avro_type: Any) -> Any:
    """The one non-null branch of a union (the type itself if no union); None for wider unions."""
    if not isinstance(avro_type, list):
        return avro_type
    branches = [branch for branch in avro_type if branch != "null"]
    return branches[0] if len(branches) == 1 else None
