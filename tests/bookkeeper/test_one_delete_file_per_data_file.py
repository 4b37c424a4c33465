"""Each data file of an upsert table has at most one live position-delete file: a cycle that deletes
more rows of a data file writes one file with the earlier positions and the new ones, and the same
snapshot removes the earlier file (as Iceberg's Spark writes do with file-scoped deletes). Readers
see the same rows; a compaction the reaper planned before such a merge still lands."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.bookkeeper.table_key_indexes import live_files
from icekeeper.common.delete_files import read_position_deletes, read_positions_in, single_target
from icekeeper.common.moniker import Moniker, moniker_id
from icekeeper.common.rewrites import is_pending, publish_rewrite, refusal
from icekeeper.common.transports import open_transport
from icekeeper.readers import spark_rows
from tests.bookkeeper.test_rewrites import compacted_request, random_changes
from tests.bookkeeper.test_upsert import upsert_table_with
from tests.support.shop_items import (
    UpsertWriter,
    applied,
    bookkeeper_config,
    duckdb_rows,
    pyiceberg_rows,
)


def delete_files_per_data_file(bookkeeper: Bookkeeper) -> Counter[str]:
    """Live position-delete files per data file of `shop.items`, checking on the way that each
    points into one live data file of its own partition and spec, and that the snapshot summary
    counts the same delete files."""
    table = bookkeeper.catalog.load_table("shop.items")
    snapshot = table.current_snapshot()
    data_files, delete_files = live_files(table, snapshot)
    data_by_path = {data.file_path: data for data in data_files}
    counts: Counter[str] = Counter()
    for delete_file in delete_files:
        target = single_target(delete_file)
        assert target in data_by_path, f"a delete file for a data file not in the table: {target}"
        assert delete_file.spec_id == data_by_path[target].spec_id
        assert tuple(delete_file.partition) == tuple(data_by_path[target].partition)
        counts[target] += 1
    assert int(snapshot.summary["total-delete-files"]) == len(delete_files)
    return counts


def deleted_positions(bookkeeper: Bookkeeper, data_path: str) -> list[int]:
    table = bookkeeper.catalog.load_table("shop.items")
    _, delete_files = live_files(table, table.current_snapshot())
    return sorted(
        position
        for delete_file in delete_files
        if single_target(delete_file) == data_path
        for position in read_position_deletes(delete_file.file_path)[1].tolist()
    )


def test_a_data_file_updated_by_many_cycles_keeps_one_delete_file(tmp_path: Path) -> None:
    # No purge: the first file would be replaced by its live rows once 30% of them are deleted.
    _, transport, writer, bookkeeper = upsert_table_with(
        tmp_path, 100, bookkeeper__purge_deleted_share="0"
    )
    table = bookkeeper.catalog.load_table("shop.items")
    [first] = [data.file_path for data in live_files(table, table.current_snapshot())[0]]
    reference = {k: k for k in range(100)}
    for cycle in range(6):
        # Two monikers per cycle, both changing rows of the first file (they share its delete
        # file), and key 99 every time, whose row moves into each cycle's new file.
        keys = range(cycle * 10, cycle * 10 + 10)
        updates = [(k, 1000 * cycle + k) for k in keys if k % 3] + [(99, cycle)]
        deletes = [(k, None) for k in keys if k % 3 == 0]
        transport.publish(writer.batch(updates))
        transport.publish(writer.batch(deletes))
        [result] = bookkeeper.run_cycle().tables
        assert len(result.committed) == 2
        reference.update(updates)
        for key, _ in deletes:
            reference.pop(key)
        counts = delete_files_per_data_file(bookkeeper)
        assert max(counts.values()) == 1, counts
        # The first file's one delete file holds every row of it replaced so far: the key-99 row
        # (first cycle) and keys 0 .. 10 * (cycle + 1) - 1 (rows 0 .. 10 * (cycle + 1) - 1).
        assert deleted_positions(bookkeeper, first) == sorted({*range(10 * (cycle + 1)), 99}), cycle
        assert pyiceberg_rows(bookkeeper) == reference
    summary = bookkeeper.catalog.load_table("shop.items").current_snapshot().summary
    # The first file's earlier delete file left; key 99's row was in a file without deletes.
    assert int(summary["removed-position-delete-files"]) == 1, summary
    assert duckdb_rows(bookkeeper) == reference


def test_a_cycle_that_loses_its_commit_to_a_merge_takes_over_the_new_delete_file(
    tmp_path: Path,
) -> None:
    """Another bookkeeper merges the first file's delete file between our plan and our
    compare-and-swap: our second attempt takes over the file it wrote, not the one it saw."""
    config, transport, writer, _ = upsert_table_with(tmp_path, 50)
    transport.publish(writer.batch([(k, -k) for k in range(5)]))
    Bookkeeper(config).run_cycle()
    other_writer = UpsertWriter(config, writer_id="w2")
    transport.publish(writer.batch([(k, -k) for k in range(5, 10)]))
    ours, theirs = Bookkeeper(config), Bookkeeper(config)
    deliveries = ours.transport.receive()
    theirs_moniker = other_writer.batch([(k, -k) for k in range(10, 15)])
    other_partition = [r.model_copy(update={"partition": 1}) for r in theirs_moniker.offsets]
    transport.publish(  # from another Kafka partition: its offsets do not overlap ours
        theirs_moniker.model_copy(
            update={
                "offsets": other_partition,
                "id": moniker_id("w2", "shop.items", other_partition),
            }
        )
    )
    original = ours.committer.commit_path.compare_and_swap
    raced = []

    def commit_after_the_other(changes):
        if not raced:
            theirs_deliveries = [
                d
                for d in theirs.transport.receive()
                if d.moniker is not None and d.moniker.writer_id == "w2"
            ]
            raced.append(theirs.committer.commit_table("shop.items", theirs_deliveries))
        return original(changes)

    ours.committer.commit_path.compare_and_swap = commit_after_the_other
    result = ours.committer.commit_table("shop.items", deliveries)
    assert raced[0].snapshot_id is not None and len(raced[0].committed) == 1
    assert result.attempts == 2 and len(result.committed) == 1
    table = ours.catalog.load_table("shop.items")
    first = live_files(table, table.current_snapshot())[0][0]  # in commit order
    counts = delete_files_per_data_file(ours)
    assert max(counts.values()) == 1, counts
    assert deleted_positions(ours, first.file_path) == list(range(15))
    expected = {k: (-k if k < 15 else k) for k in range(50)}
    assert pyiceberg_rows(ours) == expected == duckdb_rows(ours)


def bucket_of(key: int) -> int:
    return BucketTransform(2).transform(LongType())(key)


class BucketedUpsertWriter(UpsertWriter):
    """An `UpsertWriter` for `shop.items` partitioned by `bucket(2, id)`: one moniker per bucket
    and batch, its files carrying their partition."""

    def batches(self, changes: list[tuple[int, int | None]]) -> list[Moniker]:
        monikers = []
        for bucket in (0, 1):
            part = [change for change in changes if bucket_of(change[0]) == bucket]
            if not part:
                continue
            moniker = self.batch(part)
            monikers.append(
                moniker.model_copy(
                    update={
                        "files": [
                            entry.model_copy(update={"partition": {"id_bucket": bucket}})
                            for entry in moniker.files
                        ]
                    }
                )
            )
        return monikers


def test_a_partitioned_tables_merged_delete_files_keep_their_data_files_partition(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(
        tmp_path,
        mode="upsert",
        tables="[{identifier: shop.items, topics: [items], primary_key: [id], mode: upsert, "
        "partition_by: ['bucket(2, id)']}]",
    )
    transport, writer = open_transport(config), BucketedUpsertWriter(config)
    bookkeeper = Bookkeeper(config)
    rng, reference = random.Random(8), {}
    for changes in [[(k, k) for k in range(60)]] + [random_changes(rng, 25, 60) for _ in range(8)]:
        for moniker in writer.batches(changes):
            transport.publish(moniker)
        assert bookkeeper.run_cycle().tables[0].committed
        applied(reference, changes)
        counts = delete_files_per_data_file(bookkeeper)  # checks partition and spec too
        assert not counts or max(counts.values()) == 1, counts
    table = bookkeeper.catalog.load_table("shop.items")
    assert {tuple(data.partition) for data in live_files(table, table.current_snapshot())[0]} == {
        (0,),
        (1,),
    }
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)


def test_a_compaction_planned_before_a_merge_removes_the_current_delete_files(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert", bookkeeper__rewrite_poll_interval="0.001")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    reference = {k: k for k in range(80)}
    transport.publish(writer.batch(list(reference.items())))
    bookkeeper.run_cycle()
    transport.publish(writer.batch([(k, -k) for k in range(10)]))
    bookkeeper.run_cycle()
    reference.update({k: -k for k in range(10)})
    table = bookkeeper.catalog.load_table("shop.items")
    _, planned_with = live_files(table, table.current_snapshot())
    assert planned_with, "the first file has a delete file when the compaction is planned"
    request = compacted_request(bookkeeper)  # the reaper reads the live rows here...
    # ...and before it hands its files over, two cycles delete more rows of the same files: their
    # delete files are merged into new ones, and the ones the compaction saw leave the table.
    for changes in ([(k, 500 + k) for k in range(10, 20)], [(5, None), (15, 7), (70, None)]):
        transport.publish(writer.batch(changes))
        bookkeeper.run_cycle()
        applied(reference, changes)
    table = bookkeeper.catalog.load_table("shop.items")
    _, before_rewrite = live_files(table, table.current_snapshot())
    assert not {d.file_path for d in planned_with} & {d.file_path for d in before_rewrite}
    location = table.location()
    publish_rewrite(location, request)
    changes = [(k, 900 + k) for k in range(15, 25)] + [(30, None)]
    transport.publish(writer.batch(changes))  # merged once more in the cycle that commits it
    bookkeeper.run_cycle()
    reference.update(changes)
    reference.pop(30)
    assert not is_pending(location, request.id) and refusal(location, request.id) is None
    table = bookkeeper.catalog.load_table("shop.items")
    replaced = set(request.replaced)
    data_files, _ = live_files(table, table.current_snapshot())
    assert not replaced & {data.file_path for data in data_files}
    counts = delete_files_per_data_file(bookkeeper)  # none left for a replaced file
    assert not counts or max(counts.values()) == 1, counts
    # No row came back: the keys changed after the compaction read them are stale in its file.
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)
    for changes in ([(k, 3 * k) for k in range(0, 80, 3)], [(k, None) for k in range(40, 50)]):
        transport.publish(writer.batch(changes))
        bookkeeper.run_cycle()
        applied(reference, changes)
        counts = delete_files_per_data_file(bookkeeper)
        assert max(counts.values()) == 1, counts
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)


@pytest.mark.integration
@pytest.mark.spark
def test_spark_reads_an_upsert_table_with_merged_delete_files_like_the_others(
    spark, tmp_path: Path
) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert", catalog__name=f"cat_{uuid.uuid4().hex[:8]}")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(12), {}
    for changes in [[(k, k) for k in range(200)]] + [
        random_changes(rng, 40, 200) for _ in range(6)
    ]:
        transport.publish(writer.batch(changes))
        assert bookkeeper.run_cycle().tables[0].committed
        applied(reference, changes)
    counts = delete_files_per_data_file(bookkeeper)
    assert max(counts.values()) == 1, counts
    rows = spark_rows(spark, config, "shop.items", "id, amount")
    assert len(rows) == len({row["id"] for row in rows}), "a key has two live rows"
    assert {row["id"]: row["amount"] for row in rows} == reference
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)


def test_a_delete_file_with_rows_for_another_data_file_is_not_taken_over(tmp_path: Path) -> None:
    """Only a delete file whose every row points into the data file is merged and removed; the
    footer's statistics spare reading its paths, and a file they do not vouch for is read."""
    first, second = f"file://{tmp_path}/a.parquet", f"file://{tmp_path}/b.parquet"
    scoped = tmp_path / "scoped.parquet"
    shared = tmp_path / "shared.parquet"
    for path, rows in ((scoped, [(first, 3), (first, 7)]), (shared, [(first, 1), (second, 2)])):
        pq.write_table(
            pa.table(
                {"file_path": [p for p, _ in rows], "pos": [n for _, n in rows]},
                schema=pa.schema(
                    [
                        pa.field(
                            "file_path", pa.string(), False, {b"PARQUET:field_id": b"2147483546"}
                        ),
                        pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": b"2147483545"}),
                    ]
                ),
            ),
            path,
        )
    assert read_positions_in(f"file://{scoped}", first).tolist() == [3, 7]
    assert read_positions_in(f"file://{scoped}", second) is None
    assert read_positions_in(f"file://{shared}", first) is None
