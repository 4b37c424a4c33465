"""Moniker values for the codec and transport tests:
well-formed monikers with no files behind them."""

from __future__ import annotations

import uuid

from icekeeper.common.moniker import FileEntry, Moniker, OffsetRange, moniker_id

SAMPLE_SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}


def sample_moniker(
    seq: int = 3,
    prev_seq: int | None = 2,
    writer: str = "w1",
    table: str = "db.t",
    until: int = 150,
    files: int = 2,
) -> Moniker:
    """A moniker of `writer` for `table` over two partitions of topic `t`, with `files` files."""
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
        schema=SAMPLE_SCHEMA,
        files=entries,
        offsets=offsets,
        records=sum(entry.record_count for entry in entries),
        min_event_time_ms=1,
        max_event_time_ms=5,
    )


def big_moniker(files: int) -> Moniker:
    """A moniker of `files` one-record files, to make a message too large for a queue."""
    offsets = [OffsetRange(topic="big", partition=0, from_offset=0, until_offset=files)]
    entries = [
        FileEntry(
            path=f"file:///wh/db/big/data/{uuid.uuid4().hex}-{index}.parquet",
            size_bytes=100,
            record_count=1,
        )
        for index in range(files)
    ]
    return Moniker(
        id=moniker_id("w1", "db.big", offsets),
        writer_id="w1",
        seq=1,
        table="db.big",
        schema={"type": "struct", "fields": []},
        files=entries,
        offsets=offsets,
        records=files,
    )
