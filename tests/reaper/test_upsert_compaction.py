"""Compaction of an upsert table lands while the bookkeeper keeps updating the same files: the
reaper writes the compacted files, the bookkeeper commits them and deletes again the rows whose
keys changed meanwhile, and its key index follows the live rows to their new files. Nothing is
lost or resurrected, and later updates find the rows in the new files. A small table's pass
leaves one file per partition (its live bytes are far under the target size) in place of all the
small files it had, however many read tasks Spark planned for them."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.moniker import Moniker
from icekeeper.common.rewrites import pending_rewrites
from icekeeper.common.transports import open_transport
from icekeeper.readers import duckdb_rows, spark_rows
from icekeeper.reaper.service import Reaper
from tests.support.pipeline import register_catalog
from tests.support.shop_items import SCHEMA, UpsertWriter, applied, reaper_config, write_file

pytestmark = [pytest.mark.integration, pytest.mark.spark]

KEYS = 300
REWRITTEN_FOLDER = "/data/icekeeper-rewrites/"
"""Where the reaper writes a compaction's files (`common/rewrites.py` `output_folder`)."""


def running(config: IcekeeperConfig) -> Bookkeeper:
    """The group's bookkeeper, holding its lease as a running one does (it renews it every cycle):
    a reaper pass waits for the commit of its compaction only on such a bookkeeper."""
    bookkeeper = Bookkeeper(config)
    assert bookkeeper.take_lease(timeout_s=5) is not None
    return bookkeeper


def random_changes(rng: random.Random, count: int) -> list[tuple[int, int | None]]:
    return [
        (rng.randrange(KEYS), None if rng.random() < 0.15 else rng.randrange(10**6))
        for _ in range(count)
    ]


def commit(
    bookkeeper: Bookkeeper, transport, writer: UpsertWriter, changes: list, reference: dict
) -> None:
    """Publish one batch and cycle until it is committed
    (a cycle may lose to the reaper's commits)."""
    moniker = writer.batch(changes)
    transport.publish(moniker)
    for _ in range(20):
        if any(
            d.moniker.id == moniker.id
            for table in bookkeeper.run_cycle().tables
            for d in table.committed
        ):
            applied(reference, changes)
            return
    raise AssertionError("a batch was never committed")


@contextlib.contextmanager
def updates_continuing(
    bookkeeper: Bookkeeper, transport, writer: UpsertWriter, rng: random.Random, reference: dict
) -> Iterator[list[int]]:
    """Batches committed one after another while the caller's block runs; yields their count."""
    stop = threading.Event()
    failure: list[BaseException] = []
    batches = [0]

    def keep_updating() -> None:
        try:
            while not stop.is_set():
                commit(bookkeeper, transport, writer, random_changes(rng, 40), reference)
                batches[0] += 1
                # Twenty commits a second, not back to back: the reaper's expiry commits through
                # Iceberg's optimistic retries too, and a committer with no pause at all could win
                # every one of them (a fresh-clone CI run failed so).
                stop.wait(0.05)
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            failure.append(error)

    updater = threading.Thread(target=keep_updating)
    updater.start()
    try:
        yield batches
    finally:
        stop.set()
        updater.join(timeout=120)
    assert not failure, failure


def live_rows(rows: list[dict]) -> dict[int, int]:
    keys = [row["id"] for row in rows]
    assert len(keys) == len(set(keys)), "a key has two live rows"
    return {row["id"]: row["amount"] for row in rows}


def current_files(table: Table) -> list[dict]:
    """`file_path` and `partition` (a dict) of every data file of the current snapshot."""
    files = table.inspect.files()
    return [
        row
        for row in files.select(["content", "file_path", "partition"]).to_pylist()
        if row["content"] == 0
    ]


def rewrite_snapshot(table: Table) -> Snapshot:
    [rewrite] = [
        s
        for s in table.snapshots()
        if s.summary and "icekeeper.rewrite-id" in s.summary.additional_properties
    ]
    return rewrite


def assert_packed(table: Table, files_before_pass: set[str], partitions: int) -> None:
    """The pass merged every file the table had before it, into one file per partition: the table
    is a few KB, far under the target size."""
    files = current_files(table)
    left = [row["file_path"] for row in files if row["file_path"] in files_before_pass]
    assert not left, f"{len(left)} of {len(files_before_pass)} files were not compacted"
    written = Counter(
        tuple(sorted(row["partition"].items()))
        for row in files
        if REWRITTEN_FOLDER in row["file_path"]
    )
    assert len(written) == partitions and set(written.values()) == {1}, written


def test_compaction_lands_while_updates_continue(spark, tmp_path: Path) -> None:
    config = reaper_config(
        tmp_path,
        mode="upsert",
        reaper__compact_delete_ratio="0.1",
        bookkeeper__keep_snapshots="200",
        bookkeeper__rewrite_poll_interval="0.5",
        reaper__rewrite_wait="120",
        # The reaper's compaction alone (with the bookkeeper's purges: the test after this one).
        bookkeeper__purge_deleted_share="0",
    )
    register_catalog(spark, config)
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), running(config)
    rng, reference = random.Random(11), {}
    for _ in range(25):
        commit(bookkeeper, transport, writer, random_changes(rng, 60), reference)
    table = bookkeeper.catalog.load_table("shop.items")
    assert int(table.current_snapshot().summary["total-position-deletes"]) > 0
    files_before = {row["file_path"] for row in current_files(table)}

    with updates_continuing(bookkeeper, transport, writer, rng, reference) as batches:
        [table_report] = Reaper(config, spark=spark).run_pass().tables
    assert not table_report.errors, table_report.errors
    assert table_report.files_compacted > 0 and batches[0] > 0, (table_report, batches)
    table = bookkeeper.catalog.load_table("shop.items")
    # Updates committed while the reaper wrote its files: their keys' rows in the new files are
    # stale, and the rewrite snapshot deletes them (the remapping this test is about).
    rewrite = rewrite_snapshot(table)
    assert int(rewrite.summary["added-position-deletes"]) > 0, rewrite.summary
    assert_packed(table, files_before, partitions=1)
    assert live_rows(table.scan().to_arrow().to_pylist()) == reference, (
        "an update was lost or a row resurrected"
    )
    # After the pass: more updates of the same keys, which must find the rows in their new files.
    for _ in range(5):
        commit(bookkeeper, transport, writer, random_changes(rng, 80), reference)
    table = bookkeeper.catalog.load_table("shop.items")
    assert live_rows(table.scan().to_arrow().to_pylist()) == reference
    assert live_rows(duckdb_rows(table, "id, amount")) == reference
    assert live_rows(spark_rows(spark, config, "shop.items", "id, amount")) == reference


def test_compaction_lands_while_the_bookkeeper_purges_files_it_read(
    spark, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The bookkeeper purges mostly-deleted files after its commits (`bookkeeper/purges.py`), some
    of them files the reaper is compacting meanwhile: the compaction lands all the same (refusing it
    for its files gone would refuse it at most passes under steady updates), its rows of the purged
    files deleted again as stale, and no row is lost or resurrected. The first file (every key) is
    over the purge's size cap, so the reaper's files are never all gone (a compaction whose every
    file was purged is refused: nothing of it is left to commit)."""
    config = reaper_config(
        tmp_path,
        mode="upsert",
        reaper__compact_delete_ratio="0.1",
        bookkeeper__keep_snapshots="400",
        bookkeeper__rewrite_poll_interval="0.5",
        bookkeeper__purge_max_file_bytes="3500",  # a batch's file is ~2.2 KB, the first ~4.7 KB
        reaper__rewrite_wait="120",
    )
    register_catalog(spark, config)
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), running(config)
    rng, reference = random.Random(13), {}
    commit(bookkeeper, transport, writer, [(k, k) for k in range(KEYS)], reference)
    for _ in range(12):
        commit(bookkeeper, transport, writer, random_changes(rng, 60), reference)
    before = {s.snapshot_id for s in bookkeeper.catalog.load_table("shop.items").snapshots()}

    with caplog.at_level(logging.INFO, logger="icekeeper.reaper.upsert_compaction"):
        with updates_continuing(bookkeeper, transport, writer, rng, reference) as batches:
            [table_report] = Reaper(config, spark=spark).run_pass().tables
    assert not table_report.errors, table_report.errors
    assert batches[0] > 0
    [handed_over] = [r for r in caplog.records if r.msg == "compaction handed to the bookkeeper"]
    table = bookkeeper.catalog.load_table("shop.items")
    rewrites = {
        origin: [
            s
            for s in table.snapshots()
            if s.snapshot_id not in before
            and s.summary.additional_properties.get("icekeeper.rewrite-origin") == origin
        ]
        for origin in ("reaper", "bookkeeper")
    }
    [compaction] = rewrites["reaper"]
    assert rewrites["bookkeeper"], "the bookkeeper purged files during the pass"
    # Some files the reaper compacted were purged before its commit: it replaced the others.
    assert 0 < int(compaction.summary["deleted-data-files"]) < handed_over.files_replaced
    # The pass reports its own compaction, not the purges committed meanwhile.
    assert table_report.files_compacted == int(compaction.summary["deleted-data-files"])
    assert int(compaction.summary["added-position-deletes"]) > 0, compaction.summary
    assert live_rows(table.scan().to_arrow().to_pylist()) == reference, (
        "an update was lost or a row resurrected"
    )
    for _ in range(5):
        commit(bookkeeper, transport, writer, random_changes(rng, 80), reference)
    table = bookkeeper.catalog.load_table("shop.items")
    assert live_rows(table.scan().to_arrow().to_pylist()) == reference
    assert live_rows(duckdb_rows(table, "id, amount")) == reference
    assert live_rows(spark_rows(spark, config, "shop.items", "id, amount")) == reference


def test_a_pass_with_no_bookkeeper_running_leaves_its_compaction_for_the_next_start_at_once(
    spark, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No bookkeeper runs (the last one stopped and released the group's lease): the pass hands its
    compaction over and goes on at once, instead of waiting `rewrite_wait` for nobody (`make demo`
    sat 5 minutes so); the bookkeeper commits it in its first cycle when it starts again."""
    config = reaper_config(
        tmp_path,
        mode="upsert",
        reaper__compact_delete_ratio="0.1",
        bookkeeper__keep_snapshots="200",
        reaper__rewrite_wait="120",
        bookkeeper__purge_deleted_share="0",
    )
    register_catalog(spark, config)
    transport, writer, earlier = open_transport(config), UpsertWriter(config), running(config)
    rng, reference = random.Random(17), {}
    for _ in range(12):
        commit(earlier, transport, writer, random_changes(rng, 60), reference)
    earlier.stop.set()
    earlier.run()  # stops at once, as on SIGTERM: releases its lease
    table = earlier.catalog.load_table("shop.items")
    files_before = {row["file_path"] for row in current_files(table)}

    with caplog.at_level(logging.INFO, logger="icekeeper.reaper"):
        [table_report] = Reaper(config, spark=spark).run_pass().tables
    assert not table_report.errors, table_report.errors
    assert table_report.compaction_pending.startswith("no bookkeeper is running"), table_report
    [left] = [
        r
        for r in caplog.records
        if r.msg == "compaction handed to the bookkeeper, not committed yet"
    ]
    assert left.waited_s < 5, f"waited {left.waited_s} s for a bookkeeper that is not running"
    assert table_report.files_compacted == 0 and len(pending_rewrites(table.location())) == 1

    # The bookkeeper's next start: its first cycle commits the compaction.
    Bookkeeper(config).run(once=True)
    table = earlier.catalog.load_table("shop.items")
    assert rewrite_snapshot(table).summary.additional_properties["icekeeper.rewrite-origin"] == (
        "reaper"
    )
    assert pending_rewrites(table.location()) == []
    assert_packed(table, files_before, partitions=1)
    assert live_rows(table.scan().to_arrow().to_pylist()) == reference


PARTITIONS = 3


def partition_of(key: int) -> int:
    """Skewed on purpose: partition 0 holds two thirds of the keys."""
    return 0 if key < 2 * KEYS // 3 else 1 + key % (PARTITIONS - 1)


class PartitionedUpsertWriter(UpsertWriter):
    """`UpsertWriter`'s batches for `shop.items` partitioned by `_kfk_partition` (`partition_of`
    the key): one data file per partition a batch touches, as the writers lay them out."""

    def batch(self, changes: list[tuple[int, int | None]]) -> Moniker:
        last = self.last_changes(changes)
        folder = self.batch_folder()
        files = []
        for partition in range(PARTITIONS):
            rows = [
                {"id": k, "amount": a, "_kfk_partition": partition, "_kfk_offset": o}
                for k, (a, o) in last.items()
                if a is not None and partition_of(k) == partition
            ]
            if rows:
                entry = write_file(
                    folder / f"_kfk_partition={partition}" / f"{uuid.uuid4().hex}.parquet",
                    SCHEMA,
                    rows,
                )
                files.append(entry.model_copy(update={"partition": {"_kfk_partition": partition}}))
        return self.moniker(len(changes), files, self.deleted_keys(folder, last, partition_of))


def test_compaction_leaves_one_file_per_small_partition(spark, tmp_path: Path) -> None:
    """Partitioned: each partition's small and worn files end as one file of that partition, while
    updates keep landing in all of them."""
    config = reaper_config(
        tmp_path,
        mode="upsert",
        tables="[{identifier: shop.items, topics: [items], primary_key: [id], mode: upsert, "
        "partition_by: [_kfk_partition]}]",
        reaper__compact_delete_ratio="0.1",
        bookkeeper__keep_snapshots="200",
        bookkeeper__rewrite_poll_interval="0.5",
        reaper__rewrite_wait="120",
        # The layout of the reaper's files alone: the bookkeeper's purges write more.
        bookkeeper__purge_deleted_share="0",
    )
    register_catalog(spark, config)
    transport, bookkeeper = open_transport(config), running(config)
    writer = PartitionedUpsertWriter(config)
    rng, reference = random.Random(5), {}
    for _ in range(20):
        commit(bookkeeper, transport, writer, random_changes(rng, 60), reference)
    table = bookkeeper.catalog.load_table("shop.items")
    assert int(table.current_snapshot().summary["total-position-deletes"]) > 0
    files_before = {row["file_path"] for row in current_files(table)}
    assert len(files_before) >= 3 * PARTITIONS

    with updates_continuing(bookkeeper, transport, writer, rng, reference) as batches:
        [table_report] = Reaper(config, spark=spark).run_pass().tables
    assert not table_report.errors, table_report.errors
    assert batches[0] > 0
    table = bookkeeper.catalog.load_table("shop.items")
    assert_packed(table, files_before, partitions=PARTITIONS)
    for partition in range(PARTITIONS):
        # A scan pruned by partition finds every row of its partition: the compacted files carry
        # the partition they hold.
        pruned = table.scan(row_filter=f"_kfk_partition == {partition}").to_arrow().to_pylist()
        assert live_rows(pruned) == {
            key: amount for key, amount in reference.items() if partition_of(key) == partition
        }
    assert live_rows(table.scan().to_arrow().to_pylist()) == reference
    assert live_rows(duckdb_rows(table, "id, amount")) == reference
    assert live_rows(spark_rows(spark, config, "shop.items", "id, amount")) == reference
