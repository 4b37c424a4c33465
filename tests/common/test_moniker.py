"""The moniker codec: one wire form, deterministic ids, and clear errors for bad input."""

from __future__ import annotations

import json

import pytest

from common.moniker import (
    FileEntry,
    Moniker,
    MonikerError,
    OffsetRange,
    decode_moniker,
    encode_moniker,
    moniker_id,
)

SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}


def make_moniker(
    seq: int = 3,
    prev_seq: int | None = 2,
    writer: str = "w1",
    table: str = "db.t",
    until: int = 150,
    files: int = 2,
) -> Moniker:
    offsets = [
        OffsetRange(topic="t", partition=0, from_offset=100, until_offset=until),
        OffsetRange(topic="t", partition=1, from_offset=7, until_offset=9),
    ]
    entries = [
        FileEntry(
            path=f"file:///wh/db/t/data/f{index}.parquet",
            size_bytes=1000 + index,
            record_count=10 + index,
        )
        for index in range(files)
    ]
    return Moniker(
        id=moniker_id(writer, table, offsets),
        writer_id=writer,
        seq=seq,
        prev_seq=prev_seq,
        table=table,
        schema=SCHEMA,
        files=entries,
        offsets=offsets,
        records=sum(entry.record_count for entry in entries),
        min_event_time_ms=1,
        max_event_time_ms=5,
    )


def test_round_trip_keeps_every_field() -> None:
    moniker = make_moniker()
    decoded = decode_moniker(encode_moniker(moniker))
    assert decoded == moniker
    assert decoded.schema_ == SCHEMA and decoded.bytes == 2001


def test_id_depends_on_writer_table_and_ranges_only() -> None:
    assert make_moniker(seq=3).id == make_moniker(seq=9, prev_seq=None).id
    assert make_moniker().id != make_moniker(writer="w2").id
    assert make_moniker().id != make_moniker(table="db.u").id
    assert make_moniker().id != make_moniker(until=151).id
    ranges = make_moniker().offsets
    assert moniker_id("w1", "db.t", ranges) == moniker_id("w1", "db.t", list(reversed(ranges)))


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda raw: raw.replace(b'"format_version":1', b'"format_version":9'), "format_version"),
        (lambda raw: raw[: len(raw) // 2], "not JSON"),
        (lambda raw: raw.replace(b'"records":21', b'"records":22'), "records"),
        (lambda raw: raw.replace(b'"until_offset":150', b'"until_offset":50'), "until_offset"),
        (lambda raw: raw.replace(b'"writer_id":"w1"', b'"writer_id":"w9"'), "does not match"),
        (lambda raw: b"[1, 2]", "not a JSON object"),
        (lambda raw: raw.replace(b'"table"', b'"tabel"'), "table"),
    ],
)
def test_corrupt_monikers_are_rejected_with_the_reason(mutate, reason: str) -> None:
    with pytest.raises(MonikerError, match=reason):
        decode_moniker(mutate(encode_moniker(make_moniker())))


def test_prev_seq_must_precede_seq() -> None:
    with pytest.raises(ValueError, match="prev_seq"):
        make_moniker(seq=2, prev_seq=2)


def test_wire_form_is_plain_json_with_the_schema_key() -> None:
    raw = json.loads(encode_moniker(make_moniker()))
    assert raw["schema"] == SCHEMA and raw["format_version"] == 1 and "delete_files" in raw
