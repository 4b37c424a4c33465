"""A delete without a `before` image on the arrow engine: its key columns from the Kafka record key.

As on `spark-sql` (`writers/key_columns.py` matches the schemas for both): Debezium keys
every record by the primary key, a Confluent-framed Avro struct (or a bare value for a one-column
key). For each such delete the task reads the record key with its registered (writer) schema and
the version's key columns, made nullable, as the reader schema, and puts the result in the
record's `before` image: from there the row's conversions, the missing-key check and flattening
treat it as any delete, so the row gets the key columns and nothing else, as `spark-sql` gives it.

Key schemas are the ones the writer has learnt (`writers.source_batch`, from the dead letters
of a `spark-sql` batch, by id): a delete whose key names an unknown schema, does not decode or gives
values the `before` image cannot hold stays without a key (`delete-without-key`), and the engine
hands the batch to `spark-sql`, which learns the schema for the batches after it.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc

from icekeeper.writers.arrow_engine.arrow_flatten import VersionPlan, whole
from icekeeper.writers.confluent_frame import frame_prefix
from icekeeper.writers.key_columns import RecordKeys, avro_key_schemas, row_record
from icekeeper.writers.registry import RegisteredSchema


@dataclass(frozen=True)
class KeyReader:
    """How a version's record keys of one key schema are read: Avro writer and reader texts."""

    key_schema_id: int
    writer: str
    reader: str


def key_readers(
    versions: list[VersionPlan], keys: RecordKeys | None, key_schemas: list[RegisteredSchema]
) -> dict[int, tuple[KeyReader, ...]]:
    """Version index -> the readers of the key schemas that fit its row (none: keys unread)."""
    if keys is None:
        return {}
    readers: dict[int, tuple[KeyReader, ...]] = {}
    for version in versions:
        row = row_record(version.resolved) if version.is_debezium else None
        if row is None:
            continue
        fitting = []
        for key_schema in key_schemas:
            texts = avro_key_schemas(row, key_schema.resolved, keys)
            if texts is not None:
                fitting.append(KeyReader(key_schema.schema_id, *_named_alike(*texts)))
        if fitting:
            readers[version.index] = tuple(fitting)
    return readers


def _named_alike(writer: str, reader: str) -> tuple[str, str]:
    """The reader record named as the writer's: fastavro resolves records of one full name only
    (Spark's `from_avro` ignores names), and the reader is ours to name."""
    writer_record, reader_record = json.loads(writer), json.loads(reader)
    reader_record = {
        **{key: value for key, value in reader_record.items() if key != "namespace"},
        "name": writer_record["name"],
    }
    if "namespace" in writer_record:
        reader_record["namespace"] = writer_record["namespace"]
    return writer, json.dumps(reader_record)


def with_record_keys(
    decoded: pa.Table, record_keys: pa.Array, readers: tuple[KeyReader, ...]
) -> pa.Table:
    """`decoded` with each delete without `before` given a `before` image read from its record
    key (the version's key columns, the others null), where a reader can read it."""
    wanted = pc.and_(
        pc.fill_null(pc.equal(whole(decoded.column("op")), "d"), False),
        pc.is_null(whole(decoded.column("before"))),
    )
    positions = pc.indices_nonzero(wanted).to_pylist()
    if not positions:
        return decoded
    parsed = {
        frame_prefix(reader.key_schema_id): (
            fastavro.parse_schema(json.loads(reader.writer)),
            fastavro.parse_schema(json.loads(reader.reader)),
        )
        for reader in readers
    }
    before = whole(decoded.column("before"))
    images: list[dict[str, Any] | None] = []
    found: list[int] = []
    for position in positions:
        key = record_keys[position].as_py()
        schemas = parsed.get(key[:5]) if key is not None and len(key) >= 5 else None
        if schemas is None:
            continue
        try:
            images.append(fastavro.schemaless_reader(io.BytesIO(key[5:]), *schemas))
        except Exception:  # noqa: BLE001 - a key that does not decode stays without a key
            continue
        found.append(position)
    if not found:
        return decoded
    try:
        read = pa.array(images, type=before.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        return decoded  # values the row's type cannot hold: `spark-sql` decides
    # Row i takes the i-th `before`, or the read image for the deletes that got one.
    chosen = list(range(len(before)))
    for index, position in enumerate(found):
        chosen[position] = len(before) + index
    patched = pa.concat_arrays([before, read]).take(pa.array(chosen, pa.int64()))
    return decoded.set_column(decoded.schema.get_field_index("before"), "before", patched)
