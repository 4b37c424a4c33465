"""The bookkeeper purges an upsert table's mostly-deleted data files after its commits
(`bookkeeper/purges.py`): batches that update most keys of the batches before leave no live data
file with `purge_deleted_share` of its rows deleted, the table holds far fewer rows than without
purges, and pyiceberg, DuckDB and Spark read one row per key, the reference's. A bookkeeper that
dies between writing a purge and committing it leaves a request its successor commits (or refuses,
deleting its files), and updates of the same keys meanwhile lose and resurrect nothing."""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StringType

from icekeeper.bookkeeper import purges
from icekeeper.bookkeeper import rewrites as rewrites_module
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.bookkeeper.table_key_indexes import live_files
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.delete_files import read_position_deletes
from icekeeper.common.moniker import Moniker
from icekeeper.common.rewrites import (
    REWRITE_ID_PROPERTY,
    RewriteRequest,
    is_pending,
    pending_rewrites,
    publish_rewrite,
    refusal,
    rewrites_folder,
)
from icekeeper.common.storage import open_filesystem
from icekeeper.common.transports import open_transport
from icekeeper.readers import duckdb_rows as read_with_duckdb
from icekeeper.readers import spark_rows
from tests.bookkeeper.test_one_delete_file_per_data_file import BucketedUpsertWriter
from tests.bookkeeper.test_rewrites import committed_by, compacted_request
from tests.support.shop_items import (
    SCHEMA,
    UpsertWriter,
    applied,
    bookkeeper_config,
    duckdb_rows,
    pyiceberg_rows,
    write_file,
)

KEYS = 600
SHARE = 0.3
PARTITIONED = (
    "[{identifier: shop.items, topics: [items], primary_key: [id], mode: upsert, "
    "partition_by: ['bucket(2, id)']}]"
)
REWRITTEN_FOLDER = "/data/icekeeper-rewrites/"


def churn(rng: random.Random, keys: int = KEYS) -> list[tuple[int, int | None]]:
    """A batch as the upsert bench's: most keys updated (86%), a few deleted, some re-inserted."""
    changes: list[tuple[int, int | None]] = [
        (key, rng.randrange(10**6)) for key in rng.sample(range(keys), int(0.86 * keys))
    ]
    changes += [(key, None) for key in rng.sample(range(keys), keys // 30)]
    rng.shuffle(changes)
    return changes


def deleted_share_per_file(bookkeeper: Bookkeeper) -> dict[str, tuple[float, int]]:
    """Each live data file of `shop.items`: (deleted share, size in bytes), from its delete files
    (read back, not from the bookkeeper's index)."""
    table = bookkeeper.catalog.load_table("shop.items")
    data_files, delete_files = live_files(table, table.current_snapshot())
    deleted: dict[str, set[int]] = {}
    for delete_file in delete_files:
        for path, position in zip(*read_position_deletes(delete_file.file_path)):
            deleted.setdefault(path, set()).add(int(position))
    return {
        data.file_path: (
            len(deleted.get(data.file_path, ())) / data.record_count,
            data.file_size_in_bytes,
        )
        for data in data_files
    }


def physical_rows(bookkeeper: Bookkeeper) -> int:
    table = bookkeeper.catalog.load_table("shop.items")
    return sum(data.record_count for data in live_files(table, table.current_snapshot())[0])


def run_batches(
    config: IcekeeperConfig, batches: int, seed: int
) -> tuple[Bookkeeper, BucketedUpsertWriter, dict[int, int], list[int]]:
    """Bucketed `shop.items` taking `batches` churning batches (after one inserting every key),
    one cycle each, checked after each; returns the bookkeeper, the writer, the reference and each
    cycle's physical rows."""
    transport, writer = open_transport(config), BucketedUpsertWriter(config)
    bookkeeper = Bookkeeper(config)
    rng, reference, rows = random.Random(seed), {}, []
    for changes in [[(k, k) for k in range(KEYS)]] + [churn(rng) for _ in range(batches)]:
        for moniker in writer.batches(changes):
            transport.publish(moniker)
        report = bookkeeper.run_cycle()
        assert report.tables[0].committed
        applied(reference, changes)
        rows.append(physical_rows(bookkeeper))
        assert pyiceberg_rows(bookkeeper) == reference
    return bookkeeper, writer, reference, rows


@pytest.mark.integration
@pytest.mark.spark
def test_a_churning_upsert_table_keeps_no_mostly_deleted_file_and_reads_alike(
    spark, tmp_path: Path
) -> None:
    config = bookkeeper_config(
        tmp_path / "purged",
        mode="upsert",
        tables=PARTITIONED,
        catalog__name=f"cat_{uuid.uuid4().hex[:8]}",
    )
    bookkeeper, _, reference, rows = run_batches(config, batches=8, seed=21)
    shares = deleted_share_per_file(bookkeeper)
    worn = {path: share for path, (share, size) in shares.items() if share >= SHARE}
    assert not worn, f"live data files {SHARE:.0%} deleted or more: {worn}"
    # Without purges the same batches leave most rows of the table deleted.
    _, _, unpurged_reference, unpurged_rows = run_batches(
        bookkeeper_config(
            tmp_path / "unpurged",
            mode="upsert",
            tables=PARTITIONED,
            bookkeeper__purge_deleted_share="0",
        ),
        batches=8,
        seed=21,
    )
    assert unpurged_reference == reference
    assert rows[-1] < len(reference) / (1 - SHARE) < unpurged_rows[-1], (rows, unpurged_rows)
    print(f"physical rows per cycle, purged: {rows}; unpurged: {unpurged_rows}")
    table = bookkeeper.catalog.load_table("shop.items")
    purges = [
        s
        for s in table.snapshots()
        if s.summary is not None and REWRITE_ID_PROPERTY in s.summary.additional_properties
    ]
    assert purges and {s.summary.operation.value for s in purges} == {"replace"}
    # The new files: under the rewrites folder, with the table's codec and Iceberg field ids, and
    # one per bucket and purge at most.
    data_files, _ = live_files(table, table.current_snapshot())
    purged_files = [d for d in data_files if REWRITTEN_FOLDER in d.file_path]
    assert purged_files
    assert {tuple(d.partition) for d in data_files} == {(0,), (1,)}
    for data in purged_files:
        metadata = pq.ParquetFile(data.file_path.removeprefix("file://")).metadata
        assert metadata.row_group(0).column(0).compression == "ZSTD"
        arrow_schema = metadata.schema.to_arrow_schema()
        assert [f.metadata[b"PARQUET:field_id"] for f in arrow_schema] == [b"1", b"2", b"3", b"4"]
    per_request = Counter(
        (d.file_path.split(REWRITTEN_FOLDER)[1].split("/")[0], tuple(d.partition))
        for d in purged_files
    )
    assert set(per_request.values()) == {1}
    assert not pending_rewrites(table.location())
    spark_read = spark_rows(spark, config, "shop.items", "id, amount")
    assert len(spark_read) == len({row["id"] for row in spark_read}), "a key has two live rows"
    assert {row["id"]: row["amount"] for row in spark_read} == reference
    assert duckdb_rows(bookkeeper) == reference == pyiceberg_rows(bookkeeper)
    assert (
        bookkeeper.metrics.registry.get_sample_value(
            "icekeeper_purged_files_total", {"table": "shop.items"}
        )
        or 0
    ) >= len(purges)


def test_a_bookkeeper_restarted_from_an_index_saved_before_its_purges_catches_up(
    tmp_path: Path,
) -> None:
    """Purges save the index at the save interval, not at each rewrite: a successor starting from
    the one saved at the first commit replays the purges' snapshots like any other."""
    config = bookkeeper_config(tmp_path, mode="upsert", tables=PARTITIONED)
    _, writer, reference, _ = run_batches(config, batches=4, seed=4)
    # No clean stop: the saved index is the first commit's (the save interval is 60 s).
    second, transport = Bookkeeper(config), open_transport(config)
    rng = random.Random(40)
    for _ in range(3):
        changes = churn(rng)
        for moniker in writer.batches(changes):
            transport.publish(moniker)
        [result] = second.run_cycle().tables
        assert result.committed and not result.quarantined
        applied(reference, changes)
        assert pyiceberg_rows(second) == reference
    assert duckdb_rows(second) == reference
    assert all(share < SHARE for share, _ in deleted_share_per_file(second).values())


class Crash(BaseException):
    """The bookkeeper process dying (not an error any handler catches)."""


def published_purge_then_crash(
    tmp_path: Path,
) -> tuple[IcekeeperConfig, dict[int, int], str, UpsertWriter]:
    """An upsert table whose bookkeeper dies in a cycle's purge, after publishing its request and
    before committing it; returns the config, the reference, the request id and the writer."""
    config = bookkeeper_config(tmp_path, mode="upsert")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(9), {}
    inserts = [(k, k) for k in range(KEYS)]
    transport.publish(writer.batch(inserts))
    bookkeeper.run_cycle()
    applied(reference, inserts)

    def crash(identifier: str, request: RewriteRequest) -> None:
        raise Crash(request.id)

    bookkeeper.rewrites.commit = crash  # the second batch leaves the first file 86% deleted
    changes = churn(rng)
    transport.publish(writer.batch(changes))
    with pytest.raises(Crash):
        bookkeeper.run_cycle()
    applied(reference, changes)
    location = bookkeeper.catalog.load_table("shop.items").location()
    [request] = pending_rewrites(location)
    assert request.origin == "bookkeeper" and request.replaced and request.files
    assert transport.pending() == [], "the batch was committed and acknowledged before the purge"
    assert pyiceberg_rows(bookkeeper) == reference
    return config, reference, request.id, writer


@pytest.mark.parametrize("outcome", ["committed", "refused"])
def test_a_purge_published_by_a_bookkeeper_that_died_is_committed_or_refused_by_the_next(
    tmp_path: Path, outcome: str
) -> None:
    config, reference, request_id, writer = published_purge_then_crash(tmp_path)
    successor, transport = Bookkeeper(config), open_transport(config)
    location = successor.catalog.load_table("shop.items").location()
    [request] = pending_rewrites(location)
    if outcome == "refused":
        # Its file damaged while nobody committed it: the successor must not commit it.
        [entry] = request.files
        filesystem, path = open_filesystem(entry.path)
        with filesystem.open_output_stream(path) as stream:
            stream.write(b"not parquet")
    rng = random.Random(10)
    # Updates of the same keys (most of them live in the purge's file) before the successor's first
    # cycle commits the request: its rows of those keys are stale, deleted again by its commit.
    for cycle in range(4):
        changes = churn(rng)
        transport.publish(writer.batch(changes))
        report = successor.run_cycle()
        applied(reference, changes)
        assert pyiceberg_rows(successor) == reference == duckdb_rows(successor), cycle
    assert not pending_rewrites(location)
    table = successor.catalog.load_table("shop.items")
    committed = [
        s
        for s in table.snapshots()
        if s.summary.additional_properties.get(REWRITE_ID_PROPERTY) == request_id
    ]
    if outcome == "committed":
        assert len(committed) == 1
        assert int(committed[0].summary["added-position-deletes"]) > 0, "stale rows deleted"
    else:
        assert not committed and refusal(location, request_id) is None  # forgotten, not left
        filesystem, folder = open_filesystem(request.output_folder)
        assert filesystem.get_file_info(folder).type.name == "NotFound", "its files are deleted"
    # Purges went on after it; the rewrites folder holds nothing left behind.
    assert report.purges["shop.items"].snapshot_id is not None
    filesystem, folder = open_filesystem(rewrites_folder(location))
    assert not filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))


def test_a_purge_that_fails_leaves_the_commit_alone_and_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(11), {}

    def storage_down(*args: object) -> None:
        raise OSError("storage unavailable (test)")

    monkeypatch.setattr(purges, "_live_rows_or_skip", storage_down)
    for changes in ([(k, k) for k in range(KEYS)], churn(rng)):
        transport.publish(writer.batch(changes))
        [result] = bookkeeper.run_cycle().tables
        assert result.committed and transport.pending() == []
        applied(reference, changes)
    assert (
        bookkeeper.metrics.registry.get_sample_value(
            "icekeeper_errors_total", {"kind": "purge-failed"}
        )
        == 1
    )
    assert pyiceberg_rows(bookkeeper) == reference
    assert any(share >= SHARE for share, _ in deleted_share_per_file(bookkeeper).values())
    # The next cycle, with nothing to commit, purges what the failed one left.
    monkeypatch.undo()
    report = bookkeeper.run_cycle()
    assert not report.tables and report.purges["shop.items"].snapshot_id is not None
    assert all(share < SHARE for share, _ in deleted_share_per_file(bookkeeper).values())
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)


def test_purges_turned_off_leave_the_files_as_they_are(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert", bookkeeper__purge_deleted_share="0")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng = random.Random(12)
    for changes in ([(k, k) for k in range(KEYS)], churn(rng), churn(rng)):
        transport.publish(writer.batch(changes))
        assert not bookkeeper.run_cycle().purges
    assert physical_rows(bookkeeper) > 2 * KEYS


def test_a_compaction_whose_files_were_partly_purged_meanwhile_lands(tmp_path: Path) -> None:
    """The reaper reads files A (every key) and B; before it hands them over, the bookkeeper purges
    B (60% deleted), moving B's live rows to a file of its own. The compaction lands: A is
    replaced, and the compacted file's rows from B are all stale (deleted again), not resurrected
    beside the purge's copies."""
    config = bookkeeper_config(tmp_path, mode="upsert", bookkeeper__rewrite_poll_interval="0.001")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    reference: dict[int, int] = {}
    for changes in ([(k, k) for k in range(KEYS)], [(k, -k) for k in range(50)]):
        transport.publish(writer.batch(changes))
        bookkeeper.run_cycle()
        applied(reference, changes)
    request = compacted_request(bookkeeper)  # the reaper reads A and B here
    assert len(request.replaced) == 2
    changes = [(k, 1000 + k) for k in range(30)]  # B is 60% deleted: purged
    transport.publish(writer.batch(changes))
    report = bookkeeper.run_cycle()
    applied(reference, changes)
    assert report.purges["shop.items"].files_replaced == 1
    location = bookkeeper.catalog.load_table("shop.items").location()
    publish_rewrite(location, request)
    bookkeeper.run_cycle()
    assert refusal(location, request.id) is None and not pending_rewrites(location)
    table = bookkeeper.catalog.load_table("shop.items")
    [compaction] = [
        s
        for s in table.snapshots()
        if s.summary.additional_properties.get(REWRITE_ID_PROPERTY) == request.id
    ]
    assert int(compaction.summary["deleted-data-files"]) == 1  # A; B was gone already
    # B's 50 rows: keys 0-29 updated since, 30-49 live in the purge's file.
    assert int(compaction.summary["added-position-deletes"]) == 50
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)
    rng = random.Random(14)
    for _ in range(3):
        changes = churn(rng)
        transport.publish(writer.batch(changes))
        bookkeeper.run_cycle()
        applied(reference, changes)
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)


NOTE_SCHEMA = Schema(
    *SCHEMA.fields, NestedField(5, "note", StringType(), required=False), identifier_field_ids=[1]
)


class NotedUpsertWriter(UpsertWriter):
    """`UpsertWriter` after the source added a `note` column: its files have five columns."""

    def batch(self, changes: list[tuple[int, int | None]]) -> Moniker:
        last = self.last_changes(changes)
        folder = self.batch_folder()
        rows = [
            {"id": k, "amount": a, "_kfk_partition": 0, "_kfk_offset": o, "note": f"n{k}"}
            for k, (a, o) in last.items()
            if a is not None
        ]
        files = [write_file(folder / f"{uuid.uuid4().hex}.parquet", NOTE_SCHEMA, rows)]
        moniker = self.moniker(len(changes), files, [])
        return moniker.model_copy(update={"schema_": json.loads(NOTE_SCHEMA.model_dump_json())})


def test_files_written_before_a_schema_change_are_purged_into_files_of_their_own_columns(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert")
    transport, bookkeeper = open_transport(config), Bookkeeper(config)
    writer, noted = UpsertWriter(config), NotedUpsertWriter(config)
    transport.publish(writer.batch([(k, k) for k in range(100)]))  # four columns
    bookkeeper.run_cycle()
    noted.seq, noted.offset = writer.seq, writer.offset
    transport.publish(noted.batch([(k, k) for k in range(100, 200)]))  # five columns
    bookkeeper.run_cycle()
    # 40% of each file updated: both purged at once, into one new file per column set.
    updates = [(k, -k) for k in [*range(40), *range(100, 140)]]
    transport.publish(noted.batch(updates))
    report = bookkeeper.run_cycle()
    purge = report.purges["shop.items"]
    assert (purge.files_replaced, purge.files_written, purge.rows_moved) == (2, 2, 120), purge
    table = bookkeeper.catalog.load_table("shop.items")
    data_files, _ = live_files(table, table.current_snapshot())
    columns = sorted(
        len(pq.read_schema(d.file_path.removeprefix("file://")))
        for d in data_files
        if REWRITTEN_FOLDER in d.file_path
    )
    assert columns == [4, 5]
    # Rows of the four-column file (keys 40-99 now) read a null note, in every engine.
    updated = {*range(40), *range(100, 140)}
    expected = {
        k: (-k if k in updated else k, None if 40 <= k < 100 else f"n{k}") for k in range(200)
    }
    rows = table.scan(selected_fields=("id", "amount", "note")).to_arrow().to_pylist()
    assert {r["id"]: (r["amount"], r["note"]) for r in rows} == expected
    duckdb_read = read_with_duckdb(table, "id, amount, note")
    assert {r["id"]: (r["amount"], r["note"]) for r in duckdb_read} == expected


def test_a_file_with_no_live_row_just_leaves_with_its_delete_file(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    for changes in ([(k, k) for k in range(50)], [(k, -k) for k in range(50)]):
        transport.publish(writer.batch(changes))
        report = bookkeeper.run_cycle()
    purge = report.purges["shop.items"]
    assert (purge.files_replaced, purge.files_written, purge.rows_dropped) == (1, 0, 50), purge
    table = bookkeeper.catalog.load_table("shop.items")
    data_files, delete_files = live_files(table, table.current_snapshot())
    assert len(data_files) == 1 and not delete_files
    assert table.current_snapshot().summary.operation.value == "replace"
    assert pyiceberg_rows(bookkeeper) == {k: -k for k in range(50)} == duckdb_rows(bookkeeper)


def committed_purge_then_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_snapshots: int
) -> tuple[IcekeeperConfig, dict[int, int], RewriteRequest, UpsertWriter]:
    """An upsert table whose bookkeeper dies right after a purge's commit, before it drops the
    request (so it stays pending); its history is short (`keep_snapshots` kept, of any age), as
    if the bookkeeper had been down for `keep_snapshots_for`. Returns the config, the reference,
    the committed request and the writer."""
    config = bookkeeper_config(
        tmp_path,
        mode="upsert",
        bookkeeper__keep_snapshots=str(keep_snapshots),
        bookkeeper__keep_snapshots_for="0",
        bookkeeper__rewrite_poll_interval="0.001",
    )
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(26), {}
    finished = rewrites_module.finish_rewrite

    def die_once(location: str, request_id: str) -> None:
        monkeypatch.setattr(rewrites_module, "finish_rewrite", finished)
        raise Crash(request_id)

    for number, changes in enumerate([[(k, k) for k in range(KEYS)], churn(rng)]):
        if number == 1:  # the churn leaves the first file 86% deleted: purged after the commit
            monkeypatch.setattr(rewrites_module, "finish_rewrite", die_once)
        transport.publish(writer.batch(changes))
        try:
            bookkeeper.run_cycle()
        except Crash:
            assert number == 1
        applied(reference, changes)
    location = bookkeeper.catalog.load_table("shop.items").location()
    [request] = pending_rewrites(location)
    assert request.origin == "bookkeeper" and request.files
    assert len(committed_by(bookkeeper, request.id)) == 1, "committed, not yet dropped"
    assert pyiceberg_rows(bookkeeper) == reference
    return config, reference, request, writer


def with_requests_unlisted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Storage fails to list the rewrites folder (throttling): every poll of the requests fails
    while commits go on."""

    def throttled(location: str) -> list:
        raise OSError("listing throttled (test)")

    monkeypatch.setattr(rewrites_module, "pending_rewrites", throttled)


def files_exist(request: RewriteRequest) -> bool:
    return all(Path(entry.path.removeprefix("file://")).is_file() for entry in request.files)


def test_a_committed_purge_looked_at_again_after_its_snapshot_expired_keeps_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The successor cannot list the requests for two cycles while it commits new keys; those
    commits expire the purge's snapshot. When it can list them again, the purge is found
    committed by its files, which stay where they are: the table reads them (before, it was
    refused, its replaced files being gone, and its files, the table's, deleted)."""
    config, reference, request, writer = committed_purge_then_crash(tmp_path, monkeypatch, 2)
    successor, transport = Bookkeeper(config), open_transport(config)
    location = successor.catalog.load_table("shop.items").location()
    with_requests_unlisted(monkeypatch)
    for cycle in range(2):  # new keys only: the purge's files keep their rows
        changes = [(KEYS + 10 * cycle + k, k) for k in range(10)]
        transport.publish(writer.batch(changes))
        assert successor.run_cycle().tables[0].committed
        applied(reference, changes)
    assert not committed_by(successor, request.id), "its snapshot expired"
    assert is_pending(location, request.id)
    monkeypatch.undo()
    changes = [(KEYS + 100, 1)]
    transport.publish(writer.batch(changes))
    with caplog.at_level(logging.INFO, logger="icekeeper.bookkeeper.rewrites"):
        successor.run_cycle()
    applied(reference, changes)
    assert not is_pending(location, request.id) and refusal(location, request.id) is None
    # Known committed (a file of it is live, added by no snapshot left), not refused.
    assert "rewrite request found committed by its files" in caplog.messages
    assert "rewrite request refused" not in caplog.messages
    assert files_exist(request)
    assert pyiceberg_rows(successor) == reference == duckdb_rows(successor)


def test_a_committed_purge_whose_files_were_purged_since_leaves_them_to_orphan_removal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the successor's own purge replaced the purge's files meanwhile: they are in
    no current snapshot, but in a snapshot kept. Looked at again, the request is refused (its
    replaced files are gone) and, since a commit of it was attempted, its files are kept: the
    kept snapshot still reads (before, they were deleted with the refusal)."""
    config, reference, request, writer = committed_purge_then_crash(tmp_path, monkeypatch, 3)
    successor, transport = Bookkeeper(config), open_transport(config)
    location = successor.catalog.load_table("shop.items").location()
    with_requests_unlisted(monkeypatch)
    changes = churn(random.Random(27))  # the purge's files get mostly deleted: purged at once
    transport.publish(writer.batch(changes))
    report = successor.run_cycle()
    applied(reference, changes)
    assert report.purges["shop.items"].snapshot_id is not None
    kept_snapshot, kept_rows = report.tables[0].snapshot_id, dict(reference)
    changes = [(KEYS + k, k) for k in range(10)]  # its commit expires the purge's snapshot
    transport.publish(writer.batch(changes))
    successor.run_cycle()
    applied(reference, changes)
    table = successor.catalog.load_table("shop.items")
    live = {data.file_path for data in live_files(table, table.current_snapshot())[0]}
    assert not live & {entry.path for entry in request.files}, "purged by the successor"
    assert not committed_by(successor, request.id), "its snapshot expired"
    assert table.snapshot_by_id(kept_snapshot) is not None
    monkeypatch.undo()
    report = successor.run_cycle()  # nothing to commit (nothing expires): the requests' poll
    assert not report.tables
    assert not is_pending(location, request.id) and refusal(location, request.id) is None
    assert files_exist(request), "the files a kept snapshot names are not deleted"
    table = successor.catalog.load_table("shop.items")
    kept = table.scan(snapshot_id=kept_snapshot).to_arrow()
    assert dict(zip(kept.column("id").to_pylist(), kept.column("amount").to_pylist())) == kept_rows
    assert pyiceberg_rows(successor) == reference == duckdb_rows(successor)
