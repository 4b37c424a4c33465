"""Strings that are not UTF-8 (issue 26, item 4): both engines dead-letter the same records, as
`invalid-utf8`, and write the same others. The arrow engine's decoder (polars, fastavro) and
`spark-sql`'s (`from_avro`, which does not check UTF-8) are run on the same datums: a bad string
the writer reads fails its record, one it skips (`before` of an update, a `source` field no
metadata column keeps) does not, and a datum that is not Avro at all stays `undecodable-avro`."""

from __future__ import annotations

import io
import json
import struct

import fastavro
import pyarrow as pa
import pytest

from icekeeper.common.config.model import MetadataColumns
from icekeeper.common.schema import resolve_named_types
from icekeeper.samples.debezium import BinlogPosition, Column, TableShape, envelope
from icekeeper.writers.arrow_engine.avro_block import SchemaDecoder
from icekeeper.writers.registry import RegisteredSchema
from icekeeper.writers.spark_sql_engine.columns import ERROR
from icekeeper.writers.spark_sql_engine.decoding import decode_avro_confluent
from icekeeper.writers.version_shapes import envelope_fields, skipped_envelope_fields

pytestmark = [pytest.mark.spark]

SHAPE = TableShape(
    server="s",
    db="shop",
    table="notes",
    columns=(Column("id", "int", optional=False), Column("note", "string")),
    key=("id",),
)
MARK = "~~~~"
"""Written where a bad string goes, then replaced by as many bytes that are not UTF-8."""
NOT_UTF8 = b"\xff\xfe\xc3\x28"
SCHEMA_ID = 41


def _datum(op: str, before: dict | None, after: dict | None, **source: str) -> bytes:
    at = BinlogPosition(ts_ms=1_767_225_600_000, file="mysql-bin.000003", pos=4, gtid="g-1")
    event = envelope(SHAPE, op, before, after, at, 5)
    for name, value in source.items():
        if name == "transaction_id":
            event["transaction"]["id"] = value
        else:
            event["source"][name] = value
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(SHAPE.value_schema()), event)
    framed = struct.pack(">bI", 0, SCHEMA_ID) + body.getvalue()
    return framed.replace(MARK.encode(), NOT_UTF8)


def _row(key: int, note: str = "fine") -> dict:
    return {"id": key, "note": note}


CASES = [
    ("a good insert", _datum("c", None, _row(1)), None),
    ("a bad string in after", _datum("c", None, _row(2, MARK)), "invalid-utf8"),
    ("a bad string in before of an update", _datum("u", _row(3, MARK), _row(3)), None),
    ("a bad string in before of a delete", _datum("d", _row(4, MARK), None), "invalid-utf8"),
    ("a bad source.query (no column keeps it)", _datum("c", None, _row(5), query=MARK), None),
    ("a bad source.gtid (no column keeps it)", _datum("c", None, _row(6), gtid=MARK), None),
    ("a bad source.file (_src_file)", _datum("c", None, _row(7), file=MARK), "invalid-utf8"),
    ("a bad transaction.id", _datum("c", None, _row(8), transaction_id=MARK), "invalid-utf8"),
    ("a bad string, cut off", _datum("c", None, _row(9, MARK))[:22], "undecodable-avro"),
    ("cut off", _datum("c", None, _row(10))[:22], "undecodable-avro"),
    ("a good update", _datum("u", _row(11), _row(11, "new")), None),
]  # fmt: skip


def _arrow_reasons(values: list[bytes]) -> tuple[list[str | None], list[int]]:
    schema = SHAPE.value_schema()
    text = json.dumps(schema)
    decoder = SchemaDecoder.of(
        text,
        resolve_named_types(schema),
        skipped_envelope_fields(text, envelope_fields(MetadataColumns())),
    )
    decoded, failed = decoder.decode(pa.array(values, pa.binary()))
    return [failed.get(index) for index in range(len(values))], [
        row["id"] if row else None for row in decoded.column("after").to_pylist()
    ]


def _spark_reasons(spark, values: list[bytes]) -> tuple[list[str | None], list[int]]:
    schema = SHAPE.value_schema()
    registered = RegisteredSchema(SCHEMA_ID, json.dumps(schema), resolve_named_types(schema))
    raw = spark.createDataFrame(
        [(None, value, None, "t", 0, offset, None) for offset, value in enumerate(values)],
        "key binary, value binary, headers array<struct<key: string, value: binary>>, "
        "topic string, partition int, offset long, timestamp timestamp",
    )
    decoded = decode_avro_confluent(raw, [registered], envelope_fields(MetadataColumns()))
    column = decoded.versions[0].column
    rows = decoded.frame.orderBy("offset").select(ERROR, f"{column}.after.id").collect()
    return [row[0] for row in rows], [row[1] for row in rows if row[0] is None]


def test_both_engines_dead_letter_the_records_whose_read_strings_are_not_utf8(spark) -> None:
    values = [value for _, value, _ in CASES]
    expected = {name: reason for name, _, reason in CASES}

    arrow_reasons, arrow_written = _arrow_reasons(values)
    spark_reasons, spark_written = _spark_reasons(spark, values)

    assert dict(zip(expected, arrow_reasons, strict=True)) == expected
    assert dict(zip(expected, spark_reasons, strict=True)) == expected
    assert arrow_written == spark_written == [1, 3, 5, 6, 11]


def test_a_block_of_many_records_finds_each_bad_one() -> None:
    # polars reads a block whole or not at all: the bad datums are found by halving it.
    values = [_datum("c", None, _row(key, MARK if key % 97 == 5 else "fine")) for key in range(500)]
    reasons, written = _arrow_reasons(values)
    assert [key for key, reason in enumerate(reasons) if reason] == list(range(5, 500, 97))
    assert set(reasons) == {None, "invalid-utf8"}
    assert written == [key for key in range(500) if key % 97 != 5]
