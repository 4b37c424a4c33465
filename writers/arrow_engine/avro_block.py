"""Decode Confluent-framed Avro datums in bulk: one Avro container block per schema, read by polars.

The datums of one schema id are concatenated (each without its 5-byte frame) as the single block
of an in-memory Avro object container file whose header carries the writer schema, and polars'
vectorized reader turns the block into Arrow columns: ~500k seed-like records/s per core,
against ~45k for fastavro record by record (measured; bench/results.md).

polars' reader needs named types inlined, and refuses a union field with a non-null default
(`["string", "null"]` with `"default": "false"`, as Debezium's `source.snapshot`): the header's
schema has no defaults, which decoding never reads. A datum that does not decode fails the
whole block; then each datum is read alone with fastavro, the undecodable ones are set aside
(`undecodable-avro`, as on `spark-sql`), each of the others is cut to the bytes its schema reads
(Spark's `from_avro` ignores trailing bytes too), and the block is built again from those.

Strings must be UTF-8 (the Avro spec; a Parquet string column and its readers, DuckDB among
them, require it). Spark's `from_avro` does not check; polars does, for every string it decodes.
Both engines check exactly the strings the writer reads, so that they agree on which records are
poison (`invalid-utf8`; `decoding.valid_utf8_sql` on `spark-sql`): those of every field,
except the `source`/`transaction` fields `spark-sql` skips (`unchecked`: declared `bytes` in the
header, the same bytes on the wire), and `before`'s only where `after` is null (the only records
whose `before` is read, `lazy_before`). fastavro tells undecodable datums with every string read
as bytes, as Spark decides; polars then finds the ones with a bad string.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icekeeper.common.schema import MAX_DECIMAL_PRECISION
from icekeeper.writers.avro_binary import zigzag_varint

# Tasks run two per core: polars' own thread pool would only oversubscribe the cores.
os.environ.setdefault("POLARS_MAX_THREADS", "1")
import polars as pl

_SYNC = b"icekeeper-arrow!"
_FRAME = 5
"""Confluent's frame: a zero byte and the 4-byte schema id."""
_LONGEST_VALUE = 2**31 - 1
"""`binary_slice`'s stop for "to the end" (it takes no open end)."""
ALIGNMENT_SAMPLES = 16
"""Records of a block decoded alone to check the block's reading (`SchemaDecoder._aligned`)."""


def _text(value: bytes) -> bytes:
    return zigzag_varint(len(value)) + value


def polars_schema(resolved: Any) -> Any:
    """The writer schema as polars reads it: named types inlined (given), field defaults dropped,
    decimals wider than 38 digits read as their bytes (as `decoding.spark_decodable`)."""
    if isinstance(resolved, list):
        return [polars_schema(item) for item in resolved]
    if not isinstance(resolved, dict):
        return resolved
    wide = (
        resolved.get("logicalType") == "decimal"
        and int(resolved.get("precision", 0)) > MAX_DECIMAL_PRECISION
    )
    return {
        key: polars_schema(value)
        for key, value in resolved.items()
        if key != "default" and not (wide and key == "logicalType")
    }


def strings_as_bytes(schema: Any) -> Any:
    """`schema` with every string read as bytes (the same encoding: a length, then the bytes),
    so a reader does not check that they are UTF-8. Named types stay as they are named."""
    if schema == "string":
        return "bytes"
    if isinstance(schema, list):
        return [strings_as_bytes(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if kind == "string":
        return {key: value for key, value in schema.items() if key != "logicalType"} | {
            "type": "bytes"
        }
    if kind == "record":
        return {
            **schema,
            "fields": [
                {**field, "type": strings_as_bytes(field["type"])} for field in schema["fields"]
            ],
        }
    if kind == "array":
        return {**schema, "items": strings_as_bytes(schema["items"])}
    if kind == "map":
        return {**schema, "values": strings_as_bytes(schema["values"])}
    return schema


def _unchecked_fields(resolved: Any, unchecked: Mapping[str, frozenset[str]]) -> Any:
    """`resolved` (a record) with the strings of the fields `unchecked` names (top-level field ->
    fields of its record) read as bytes."""
    if not unchecked or not isinstance(resolved, dict) or resolved.get("type") != "record":
        return resolved

    def narrowed(node: Any, names: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [narrowed(branch, names) for branch in node]
        if not isinstance(node, dict) or node.get("type") != "record":
            return node
        return {
            **node,
            "fields": [
                {**field, "type": strings_as_bytes(field["type"])}
                if field["name"] in names
                else field
                for field in node["fields"]
            ],
        }

    return {
        **resolved,
        "fields": [
            {**field, "type": narrowed(field["type"], unchecked[field["name"]])}
            if field["name"] in unchecked
            else field
            for field in resolved["fields"]
        ],
    }


@dataclass(frozen=True)
class SchemaDecoder:
    """Decodes the datums of one registered schema."""

    schema_text: str
    """The schema as registered (fastavro reads it, named references included)."""
    header: bytes
    """The container header with the polars-readable schema."""
    columns: tuple[str, ...] = ()
    """The top-level fields, in order."""

    @classmethod
    def of(
        cls,
        schema_text: str,
        resolved: dict[str, Any],
        unchecked: Mapping[str, frozenset[str]] | None = None,
    ) -> SchemaDecoder:
        """Args:
        unchecked: envelope field -> its fields the writer does not read, whose strings are
            not checked (`spark_sql_engine.decoding.skipped_envelope_fields`).
        """
        schema = json.dumps(polars_schema(_unchecked_fields(resolved, unchecked or {}))).encode()
        header = (
            b"Obj\x01"
            + zigzag_varint(2)
            + _text(b"avro.schema")
            + _text(schema)
            + _text(b"avro.codec")
            + _text(b"null")
            + b"\x00"
            + _SYNC
        )
        fields = resolved.get("fields") if isinstance(resolved, dict) else None
        return cls(schema_text, header, tuple(field["name"] for field in fields or ()))

    @property
    def lazy_before(self) -> bool:
        """Whether `before` is read only where `after` is null (a Debezium envelope).

        Every use of `before` (`flatten.row_image`, deletes' keys) reads it only for rows
        without `after`: deletes. For updates, the most common change, it is a second copy of
        the row; not decoding it saved about a sixth of polars' decoding of seed-like envelopes.
        """
        return "before" in self.columns and "after" in self.columns

    def decode(self, datums: pa.BinaryArray) -> tuple[pa.Table, dict[int, str]]:
        """The decoded records of `datums` (framed values of this schema), and the positions in
        `datums` of those that did not decode (left out of the table) with the reason:
        `undecodable-avro`, or `invalid-utf8` (a string the writer reads is not UTF-8)."""
        if len(datums) == 0:
            return pa.table({}), {}
        decoded = self._projected(datums)
        if decoded is None:
            return self._one_by_one(datums.to_pylist())
        return decoded, {}

    def _projected(self, datums: pa.BinaryArray) -> pa.Table | None:
        """`datums` read in bulk, `before` only where `after` is null (`lazy_before`); None when
        the block does not read."""
        projection = (
            [name for name in self.columns if name != "before"] if self.lazy_before else None
        )
        decoded = self._checked(datums, projection)
        if decoded is None or projection is None:
            return decoded
        deletes = pc.fill_null(pc.is_null(decoded.column("after")), True).combine_chunks()
        before = (
            self._checked(datums.filter(deletes), ["before"])
            if pc.any(deletes).as_py()
            else (self._bulk(0, b"", ["before"]))
        )
        if before is None:
            return None
        return _placed(decoded, before.column("before").combine_chunks(), deletes, self.columns)

    def _checked(self, datums: pa.BinaryArray, columns: list[str] | None) -> pa.Table | None:
        """The block of `datums` read in bulk (top-level `columns` only), or None when it does not
        read, or reads shifted (`_aligned`)."""
        try:
            decoded = self._bulk(len(datums), unframed(datums), columns)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001 - polars also panics (a BaseException) on bad bytes
            return None
        return decoded if self._aligned(decoded, datums, columns) else None

    def _aligned(
        self, decoded: pa.Table, datums: pa.BinaryArray, columns: list[str] | None = None
    ) -> bool:
        """Whether sampled records of the block read as they read alone.

        polars reads a block's datums back to back and never checks that it used up the block:
        a datum longer than its schema reads (trailing bytes, which Spark's `from_avro` ignores)
        shifts every later record of the block, and garbage can decode without an error (tried:
        a zero byte after one datum silently changed the next ones). A shift persists to the
        block's end, so the last datum and a few others, each decoded alone (~0.1 ms apiece),
        must equal their rows; on a mismatch the block is read datum by datum, cut to what each
        schema reads. Rows are compared by their repr, so a NaN equals itself.
        """
        count = len(datums)
        sampled = {count - 1, *range(0, count, max(1, count // ALIGNMENT_SAMPLES))}
        for position in sorted(sampled):
            body = datums[position].as_py()[5:]
            alone = self._bulk(1, body, columns).to_pylist()
            if repr(alone) != repr(decoded.slice(position, 1).to_pylist()):
                return False
        return True

    def _bulk(
        self, count: int, bodies: bytes | pa.Buffer, columns: list[str] | None = None
    ) -> pa.Table:
        """polars' reading of one block; fields outside `columns` are skipped, not decoded."""
        container = b"".join(
            [self.header, zigzag_varint(count), zigzag_varint(len(bodies)), bodies, _SYNC]
        )
        return pl.read_avro(io.BytesIO(container), columns=columns).to_arrow()

    def _one_by_one(self, datums: list[bytes]) -> tuple[pa.Table, dict[int, str]]:
        # Every string read as bytes: fastavro tells the datums that are not Avro from the
        # others as Spark's `from_avro` does, which does not check UTF-8.
        parsed = fastavro.parse_schema(strings_as_bytes(json.loads(self.schema_text)))
        cut: list[bytes] = []
        positions: list[int] = []
        failed: dict[int, str] = {}
        for position, datum in enumerate(datums):
            stream = io.BytesIO(datum)
            stream.seek(5)
            try:
                fastavro.schemaless_reader(stream, parsed, None)
            except Exception:  # noqa: BLE001 - any failure means the bytes are no such datum
                failed[position] = "undecodable-avro"
                continue
            cut.append(datum[: stream.tell()])
            positions.append(position)
        decoded, unread = self._split(pa.array(cut, pa.binary()))
        for index in unread:
            failed[positions[index]] = "invalid-utf8"
        return decoded, dict(sorted(failed.items()))

    def _split(self, datums: pa.BinaryArray) -> tuple[pa.Table, list[int]]:
        """The datums (Avro, cut to what their schema reads) that polars reads in bulk, and the
        positions of those it does not: a block that does not read is halved until they are
        found, about two reads of the block per bad datum."""
        if len(datums) == 0:
            return pa.table({}), []
        decoded = self._projected(datums)
        if decoded is not None:
            return decoded, []
        if len(datums) == 1:
            body = datums[0].as_py()
            try:
                fastavro.schemaless_reader(
                    io.BytesIO(body[_FRAME:]),
                    fastavro.parse_schema(json.loads(self.schema_text)),
                    None,
                )
            except UnicodeDecodeError:
                return pa.table({}), [0]
            raise ValueError(
                "polars does not read a datum that fastavro reads, with no bad UTF-8 in it: "
                f"{body.hex()}"
            )
        half = len(datums) // 2
        first, first_unread = self._split(datums.slice(0, half))
        second, second_unread = self._split(datums.slice(half))
        tables = [table for table in (first, second) if table.num_rows]
        return (
            pa.concat_tables(tables) if len(tables) > 1 else (tables or [pa.table({})])[0],
            first_unread + [half + index for index in second_unread],
        )


def unframed(datums: pa.BinaryArray) -> pa.Buffer:
    """The datums' bytes back to back without their 5-byte frames: Arrow's `binary_slice` copies
    each value from its sixth byte into one new data buffer, which is that concatenation. Per
    100,000 seed-like datums ~9 ms, against ~50 ms for masking the frames out of the original
    buffer with numpy and ~100 ms for a Python slice per record."""
    bodies = pc.binary_slice(datums, _FRAME, _LONGEST_VALUE)
    bounds = np.frombuffer(bodies.buffers()[1], dtype=np.int32)[
        bodies.offset : bodies.offset + len(bodies) + 1
    ]
    data = bodies.buffers()[2]
    if data is None:  # every datum a bare frame
        return pa.py_buffer(b"")
    return data.slice(int(bounds[0]), int(bounds[-1]) - int(bounds[0]))


def _placed(
    decoded: pa.Table, before: pa.Array, deletes: pa.BooleanArray, columns: tuple[str, ...]
) -> pa.Table:
    """`decoded` with its `before` column: the rows of `before` (one per true of `deletes`, in
    order) where `deletes` is true, null elsewhere; columns in the schema's order."""
    marks = deletes.to_numpy(zero_copy_only=False)
    slots = np.where(marks, np.cumsum(marks) - 1, len(before))
    column = pa.concat_arrays([before, pa.nulls(1, before.type)]).take(pa.array(slots))
    return decoded.add_column(columns.index("before"), pa.field("before", before.type), column)
