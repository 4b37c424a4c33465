"""Schema versions as both engines see them: what one version's records hold, in Iceberg types.

A batch may hold several schema versions of a source's records (each registered Avro schema,
each Kafka Connect schema, each topic's inferred JSON). Decoding gives each version one struct
and a `VersionShape` that says what it holds: a Debezium envelope (its row, `source` and
`transaction` fields) or a plain row. Everything after decoding reads shapes, never schemas:
which columns a table gets (`table_columns`: the versions of its own records, merged), which
metadata columns it has, which row columns convert (their semantic types), where a delete's key
columns come from. So both engines, and every source format, meet here.

Decoding Debezium's `source` and `transaction` records costs time for every field, and the
writer reads only the fields its metadata columns and routing name (`envelope_fields`); the
Avro decoders of both engines skip the others (`reader_schema`, `skipped_envelope_fields`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.types import IcebergType

from icekeeper.common.config.model import MetadataColumns
from icekeeper.common.schema import (
    Column,
    EnvelopeShape,
    merge_columns,
    metadata_columns,
    record_types,
    row_columns,
)

DEBEZIUM_SOURCE_FIELDS = ("name", "db", "table", "ts_ms")
"""`source` fields every Debezium event has and the writer reads (routing, event time)."""


@dataclass(frozen=True)
class VersionShape:
    """One decoded version and what it holds, in Iceberg types."""

    column: str
    """The version's name in its batch (`version_column`): on `spark-sql`, its struct column."""
    is_debezium: bool
    row: list[Column]
    source: dict[str, IcebergType] = field(default_factory=dict)
    transaction: dict[str, IcebergType] = field(default_factory=dict)
    schema_id: int | None = None
    """The registry's id of the version's schema; None for JSON versions."""
    record_key: str | None = None
    """`spark-sql`: the column holding the Kafka record key read as this version's key columns,
    for deletes without a `before` image (null for other records); None when keys are not read
    (`key_columns.py`)."""
    record_key_fields: tuple[str, ...] = ()
    """The row columns `record_key` holds: the version's primary-key columns."""


def version_column(index: int) -> str:
    """The name of version `index` of a batch (`VersionShape.column`)."""
    return f"_ik_v{index}"


def shape_from_avro(column: str, shape: EnvelopeShape, schema_id: int | None) -> VersionShape:
    """The shape of a version whose schema is Avro (registered, or converted from Connect's)."""
    return VersionShape(
        column,
        shape.is_debezium,
        row_columns(shape),
        record_types(shape.source),
        record_types(shape.transaction),
        schema_id,
    )


def table_columns(versions: list[VersionShape], metadata: MetadataColumns) -> list[Column]:
    """Metadata columns then row columns, merged over `versions` (union by name, types
    widened): the columns of a table whose records in the batch are of these versions."""
    debezium = [v for v in versions if v.is_debezium]
    meta = metadata_columns(
        metadata,
        bool(debezium),
        _merged_types([v.source for v in debezium]),
        _merged_types([v.transaction for v in debezium]),
    )
    return meta + merge_columns([v.row for v in versions])


def _merged_types(type_maps: list[dict]) -> dict:
    merged = merge_columns([[Column(name, t) for name, t in types.items()] for types in type_maps])
    return {column.name: column.type for column in merged}


def envelope_fields(metadata: MetadataColumns) -> dict[str, set[str]]:
    """Debezium envelope fields a batch uses: the configured metadata columns plus routing (the
    decoder skips the others; the writer bench's baseline decodes with the same)."""
    return {
        "source": set(metadata.source.columns) | {"name", "db", "table", "ts_ms"},
        "transaction": set(metadata.transaction.columns),
    }


def reader_schema(writer_schema: str, keep: dict[str, set[str]]) -> str | None:
    """The writer schema with unused fields of Debezium's `source`/`transaction` records removed.

    Avro's schema resolution then skips those bytes instead of building values for them.
    Returns None for schemas that are not Debezium envelopes.
    """
    parsed = json.loads(writer_schema)
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        return None
    names = {envelope_field["name"] for envelope_field in parsed["fields"]}
    if not {"after", "op", "source"} <= names:
        return None
    for envelope_field in parsed["fields"]:
        wanted = keep.get(envelope_field["name"])
        record = envelope_field["type"]
        if wanted is None:
            continue
        branches = record if isinstance(record, list) else [record]
        for branch in branches:
            if isinstance(branch, dict) and branch.get("type") == "record":
                # An Avro record needs a field; keep the first when none is wanted.
                branch["fields"] = [f for f in branch["fields"] if f["name"] in wanted] or branch[
                    "fields"
                ][:1]
    return json.dumps(parsed)


def skipped_envelope_fields(
    writer_schema: str, keep: dict[str, set[str]]
) -> dict[str, frozenset[str]]:
    """Envelope field (`source`, `transaction`) -> its fields `reader_schema` skips: the fields
    neither engine decodes, whose strings neither checks for UTF-8."""
    reader = reader_schema(writer_schema, keep)
    if reader is None:
        return {}
    kept = {
        envelope_field["name"]: _record_field_names(envelope_field["type"])
        for envelope_field in json.loads(reader)["fields"]
    }
    skipped = {}
    for envelope_field in json.loads(writer_schema)["fields"]:
        name = envelope_field["name"]
        if name in keep:
            dropped = _record_field_names(envelope_field["type"]) - kept[name]
            if dropped:
                skipped[name] = frozenset(dropped)
    return skipped


def _record_field_names(avro_type: Any) -> set[str]:
    branches = avro_type if isinstance(avro_type, list) else [avro_type]
    return {
        record_field["name"]
        for branch in branches
        if isinstance(branch, dict) and branch.get("type") == "record"
        for record_field in branch["fields"]
    }
