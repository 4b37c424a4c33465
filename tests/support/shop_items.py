"""The `shop.items` test table without Spark: its schema, bookkeeper and reaper configs, monikers
over small Parquet files written with pyarrow (with Iceberg field ids), and its rows read back.

The bookkeeper's and the reaper's tests need many monikers fast; these files are what a writer would
produce for a simple table (`id`, `amount`, `_kfk_partition`, `_kfk_offset`), laid out the same way.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField

from icekeeper.common.catalog import default_table_location
from icekeeper.common.config import IcekeeperConfig, load_config
from icekeeper.common.moniker import FileEntry, Moniker, OffsetRange, moniker_id
from icekeeper.readers import duckdb_rows as read_with_duckdb

if TYPE_CHECKING:
    from icekeeper.bookkeeper.service import Bookkeeper
    from icekeeper.common.transports import MonikerTransport

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "amount", IntegerType(), required=False),
    NestedField(3, "_kfk_partition", IntegerType(), required=False),
    NestedField(4, "_kfk_offset", LongType(), required=False),
    identifier_field_ids=[1],
)


def bookkeeper_config(
    state_dir: Path, mode: str = "changelog", **overrides: str
) -> IcekeeperConfig:
    """`shop.items` keyed by `id`: a changelog (these
    fixtures repeat ids) unless `mode` says upsert."""
    environ = {
        "ICEKEEPER__STATE_DIR": str(state_dir),
        "ICEKEEPER__TABLES": "[{identifier: shop.items, topics: [items], primary_key: [id], "
        f"mode: {mode}}}]",
        "ICEKEEPER__SOURCES__0__TOPICS": "[items]",
        "ICEKEEPER__BOOKKEEPER__COMMIT_INTERVAL": "0.2",
        "ICEKEEPER__BOOKKEEPER__HTTP_PORT": "0",
        "ICEKEEPER__REAPER__HTTP_PORT": "0",
        **{f"ICEKEEPER__{key.upper()}": value for key, value in overrides.items()},
    }
    return load_config(None, environ=environ)


GRACE_S = 5
"""Seconds the reaper's orphan removal leaves a file alone (`reaper_config`)."""


def reaper_config(tmp_path: Path, mode: str = "changelog", **overrides: str) -> IcekeeperConfig:
    """`bookkeeper_config` with a catalog of the test's own and the reaper's work made visible:
    snapshots expire at once (two kept), orphans after `GRACE_S`, history kept by the bookkeeper."""
    settings = {
        "catalog__name": f"cat_{uuid.uuid4().hex[:8]}",
        "reaper__snapshot_expire_time": "0",
        "reaper__retain_last": "2",
        "group__orphan_grace": str(GRACE_S),
        "reaper__compact_target_file_size_bytes": str(32 * 1024 * 1024),
        # The bookkeeper keeps history here, so that expiring it is the reaper's work.
        "bookkeeper__keep_snapshots": "100000",
    }
    return bookkeeper_config(tmp_path, mode, **{**settings, **overrides})


def azure_queue_settings(local_stack) -> dict[str, str]:
    """Config overrides for an Azure queue transport on
    the stack's Azurite, on queues of the test's own."""
    queue = f"eg-{uuid.uuid4().hex[:10]}"
    return {
        "transport__kind": "azure-queue",
        "transport__queue_name": queue,
        "transport__dead_letter_queue_name": queue + "-dlq",
        "transport__connection_string": local_stack.service("azurite-queue").connection_string(),
    }


def write_file(path: Path, schema: Schema, rows: list[dict]) -> FileEntry:
    fields = []
    for field in schema.fields:
        arrow_type = {"long": pa.int64(), "int": pa.int32(), "string": pa.string()}[
            str(field.field_type)
        ]
        fields.append(
            pa.field(
                field.name,
                arrow_type,
                nullable=not field.required,
                metadata={b"PARQUET:field_id": str(field.field_id).encode()},
            )
        )
    strings = {f.name for f in schema.fields if str(f.field_type) == "string"}
    rows = [
        {k: (str(v) if k in strings and v is not None else v) for k, v in row.items()}
        for row in rows
    ]
    table = pa.Table.from_pylist(rows, schema=pa.schema(fields))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd")
    return FileEntry(
        path="file://" + str(path), size_bytes=path.stat().st_size, record_count=len(rows)
    )


def write_file_at(uri: str, schema: Schema, rows: list[dict]) -> FileEntry:
    """`write_file` on any store, through the storage door (`s3://...`, `abfss://...`)."""
    from icekeeper.common.storage import open_filesystem

    scratch = Path(tempfile.mkdtemp()) / "file.parquet"
    try:
        entry = write_file(scratch, schema, rows)
        filesystem, path = open_filesystem(uri)
        with filesystem.open_output_stream(path) as out:
            out.write(scratch.read_bytes())
    finally:
        shutil.rmtree(scratch.parent, ignore_errors=True)
    return entry.model_copy(update={"path": uri})


def make_moniker(
    config: IcekeeperConfig,
    seq: int,
    prev_seq: int | None,
    offsets: tuple[int, int],
    writer_id: str = "w1",
    partition: int = 0,
    schema: Schema = SCHEMA,
    files: int = 1,
    table: str = "shop.items",
) -> Moniker:
    """A moniker covering records [from, until) of `items`/`partition`, one row per record."""
    location = default_table_location(config, table)
    start, until = offsets
    entries = []
    per_file = max(1, (until - start) // files)
    for index in range(files):
        low = start + index * per_file
        high = until if index == files - 1 else low + per_file
        rows = [
            {"id": o % 1000, "amount": o, "_kfk_partition": partition, "_kfk_offset": o}
            for o in range(low, high)
        ]
        if "note" in schema.column_names:
            for row in rows:
                row["note"] = f"n{row['_kfk_offset']}"
        if "://" in location and not location.startswith("file:"):
            uri = f"{location}/data/{writer_id}/{seq:012d}/{uuid.uuid4().hex}.parquet"
            entries.append(write_file_at(uri, schema, rows))
            continue
        path = (
            Path(location.removeprefix("file://"))
            / "data"
            / writer_id
            / f"{seq:012d}"
            / f"{uuid.uuid4().hex}.parquet"
        )
        entries.append(write_file(path, schema, rows))
    ranges = [
        OffsetRange(topic="items", partition=partition, from_offset=start, until_offset=until)
    ]
    return Moniker(
        id=moniker_id(writer_id, table, ranges),
        rereads_refused=True,
        writer_id=writer_id,
        seq=seq,
        prev_seq=prev_seq,
        table=table,
        table_location=location,
        schema=json.loads(schema.model_dump_json()),
        files=entries,
        offsets=ranges,
        records=sum(e.record_count for e in entries),
        min_event_time_ms=1_700_000_000_000 + start,
        max_event_time_ms=1_700_000_000_000 + until,
    )


def whole_topic_moniker(
    config: IcekeeperConfig, seq: int, prev_seq: int | None, partitions: int
) -> Moniker:
    """A writer's batch of the whole topic: records [10(seq-1), 10 seq) of every partition (the
    file's rows are partition 0's; only the offsets matter here)."""
    moniker = make_moniker(config, seq, prev_seq, ((seq - 1) * 10, seq * 10))
    ranges = [
        OffsetRange(
            topic="items",
            partition=partition,
            from_offset=1_000_000_000 + (seq - 1) * 10,
            until_offset=1_000_000_000 + seq * 10,
        )
        for partition in range(partitions)
    ]
    return moniker.model_copy(
        update={"offsets": ranges, "id": moniker_id(moniker.writer_id, moniker.table, ranges)}
    )


def committed_chain(config: IcekeeperConfig, last_seq: int) -> tuple[MonikerTransport, Bookkeeper]:
    """A bookkeeper that committed writer w1's seqs 1..`last_seq` (offsets 0..10 `last_seq`), one
    a cycle, and the transport they came by: the start of the cases that then roll back,
    downgrade or expire the table."""
    from icekeeper.bookkeeper.service import Bookkeeper
    from icekeeper.common.transports import open_transport

    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    for seq in range(1, last_seq + 1):
        transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 10, seq * 10)))
        assert bookkeeper.run_cycle().committed_monikers == 1
    return transport, bookkeeper


class UpsertWriter:
    """Monikers for `shop.items` as a writer of an upsert table makes them: per batch, the last
    change per key; surviving rows in a data file, keys whose last change is a delete in a
    deleted-keys file (a Parquet file of the table's schema)."""

    def __init__(self, config: IcekeeperConfig, writer_id: str = "w1") -> None:
        self.config, self.writer_id = config, writer_id
        self.seq, self.offset = 0, 0
        self.location = default_table_location(config, "shop.items")

    def batch(self, changes: list[tuple[int, int | None]]) -> Moniker:
        """`changes`: (id, amount) upserts and (id, None) deletes, in offset order."""
        last = self.last_changes(changes)
        folder = self.batch_folder()
        rows = [
            {"id": k, "amount": a, "_kfk_partition": 0, "_kfk_offset": o}
            for k, (a, o) in last.items()
            if a is not None
        ]
        files = [write_file(folder / f"{uuid.uuid4().hex}.parquet", SCHEMA, rows)] if rows else []
        return self.moniker(len(changes), files, self.deleted_keys(folder, last, lambda key: 0))

    def last_changes(
        self, changes: list[tuple[int, int | None]]
    ) -> dict[int, tuple[int | None, int]]:
        """Key -> (amount or None, offset) of its last change; the offsets advance."""
        last: dict[int, tuple[int | None, int]] = {}
        for key, amount in changes:
            last[key] = (amount, self.offset)
            self.offset += 1
        return last

    def batch_folder(self) -> Path:
        """The next batch's folder (the batch number advances)."""
        self.seq += 1
        return (
            Path(self.location.removeprefix("file://"))
            / "data"
            / self.writer_id
            / f"{self.seq:012d}"
        )

    def deleted_keys(
        self,
        folder: Path,
        last: dict[int, tuple[int | None, int]],
        partition_of: Callable[[int], int],
    ) -> list[FileEntry]:
        """The deleted-keys file of the keys whose last change deletes them (none if no key)."""
        gone = [
            {"id": k, "amount": None, "_kfk_partition": partition_of(k), "_kfk_offset": o}
            for k, (a, o) in last.items()
            if a is None
        ]
        if not gone:
            return []
        entry = write_file(folder / "ik_deleted=true" / f"{uuid.uuid4().hex}.parquet", SCHEMA, gone)
        return [entry.model_copy(update={"content": "deleted-keys"})]

    def moniker(self, changes: int, files: list[FileEntry], deleted: list[FileEntry]) -> Moniker:
        """The batch's moniker: its last `changes` offsets of partition 0, its files."""
        ranges = [
            OffsetRange(
                topic="items",
                partition=0,
                from_offset=self.offset - changes,
                until_offset=self.offset,
            )
        ]
        return Moniker(
            id=moniker_id(self.writer_id, "shop.items", ranges),
            rereads_refused=True,
            writer_id=self.writer_id,
            seq=self.seq,
            prev_seq=self.seq - 1 if self.seq > 1 else None,
            table="shop.items",
            table_location=self.location,
            schema=json.loads(SCHEMA.model_dump_json()),
            files=files,
            delete_files=deleted,
            offsets=ranges,
            records=sum(f.record_count for f in files),
        )


def applied(reference: dict[int, int], changes: list[tuple[int, int | None]]) -> None:
    """`changes` ((id, amount) upserts, (id, None) deletes) applied to `reference` in order: the
    state an upsert table must mirror."""
    for key, amount in changes:
        if amount is None:
            reference.pop(key, None)
        else:
            reference[key] = amount


def pyiceberg_rows(bookkeeper: Bookkeeper) -> dict[int, int]:
    """`shop.items` as pyiceberg reads it: id -> amount, failing if a key has two live rows."""
    arrow = bookkeeper.catalog.load_table("shop.items").scan().to_arrow()
    keys = arrow.column("id").to_pylist()
    assert len(keys) == len(set(keys)), "a key has two live rows"
    return dict(zip(keys, arrow.column("amount").to_pylist()))


def duckdb_rows(bookkeeper: Bookkeeper) -> dict[int, int]:
    """`shop.items` as DuckDB reads it: id -> amount, failing if a key has two live rows."""
    rows = [
        (row["id"], row["amount"])
        for row in read_with_duckdb(bookkeeper.catalog.load_table("shop.items"), "id, amount")
    ]
    assert len(rows) == len({key for key, _ in rows}), "a key has two live rows"
    return dict(rows)
