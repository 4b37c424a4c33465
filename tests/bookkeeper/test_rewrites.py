"""The bookkeeper commits a compaction the reaper wrote while updates went on (no Spark here: the
compacted file is written from the table's live rows with pyarrow, as the reaper's Spark job
writes it): rows whose keys changed meanwhile are deleted again, the key index follows the rest,
and a compaction that would lose a row or replaces a file already gone is refused, not committed."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

from bookkeeper.service import Bookkeeper
from common.rewrites import (
    RewriteRequest,
    is_pending,
    output_folder,
    pending_rewrites,
    publish_rewrite,
    refusal,
)
from common.transports import open_transport
from tests.support.shop_items import (
    SCHEMA,
    UpsertWriter,
    applied,
    bookkeeper_config,
    duckdb_rows,
    pyiceberg_rows,
    write_file,
)


def random_changes(rng: random.Random, count: int, keys: int = 80) -> list[tuple[int, int | None]]:
    return [
        (rng.randrange(keys), None if rng.random() < 0.2 else rng.randrange(10**6))
        for _ in range(count)
    ]


def commit_batches(
    bookkeeper: Bookkeeper,
    transport,
    writer: UpsertWriter,
    rng: random.Random,
    reference: dict,
    batches: int,
) -> None:
    for _ in range(batches):
        changes = random_changes(rng, 30)
        transport.publish(writer.batch(changes))
        assert bookkeeper.run_cycle().tables[0].committed
        applied(reference, changes)


def compacted_request(bookkeeper: Bookkeeper, drop_one_row: bool = False) -> RewriteRequest:
    """What the reaper hands over: every data file of the current snapshot, replaced by one file
    of their live rows (optionally missing one, a broken compaction)."""
    table = bookkeeper.catalog.load_table("shop.items")
    snapshot = table.current_snapshot()
    replaced = [task.file.file_path for task in table.scan().plan_files()]
    rows = table.scan().to_arrow().to_pylist()
    if drop_one_row:
        rows = rows[1:]
    request_id = uuid.uuid4().hex
    folder = Path(output_folder(table.location(), request_id).removeprefix("file://"))
    entry = write_file(folder / "part-0.parquet", SCHEMA, rows)
    return RewriteRequest(
        id=request_id,
        table="shop.items",
        base_snapshot_id=snapshot.snapshot_id,
        replaced=replaced,
        files=[entry],
        schema=json.loads(SCHEMA.model_dump_json()),
        output_folder=str(folder),
    )


def test_a_compaction_written_before_updates_lands_after_them(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert", bookkeeper__rewrite_poll_interval="0.001")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(5), {}
    commit_batches(bookkeeper, transport, writer, rng, reference, 15)
    request = compacted_request(bookkeeper)
    table = bookkeeper.catalog.load_table("shop.items")
    publish_rewrite(table.location(), request)
    # The bookkeeper keeps committing updates and deletes of the compacted keys meanwhile; the
    # first cycle after them commits the compaction too.
    commit_batches(bookkeeper, transport, writer, rng, reference, 3)
    assert (
        not is_pending(table.location(), request.id)
        and refusal(table.location(), request.id) is None
    )
    table = bookkeeper.catalog.load_table("shop.items")
    [rewrite] = [
        s
        for s in table.snapshots()
        if s.summary.additional_properties.get("icekeeper.rewrite-id") == request.id
    ]
    assert rewrite.summary.operation.value == "replace"
    assert int(rewrite.summary["deleted-data-files"]) == len(request.replaced) > 1
    assert int(rewrite.summary["added-position-deletes"]) > 0, (
        "keys changed after the compaction read them: their rows are stale"
    )
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)
    # Later updates find the rows in the compacted file, also after a restart from the saved index.
    commit_batches(bookkeeper, transport, writer, rng, reference, 3)
    assert pyiceberg_rows(bookkeeper) == reference
    bookkeeper.committer.close()
    restarted = Bookkeeper(config)
    commit_batches(restarted, transport, writer, rng, reference, 3)
    assert pyiceberg_rows(restarted) == reference == duckdb_rows(restarted)
    assert (
        int(
            restarted.catalog.load_table("shop.items")
            .current_snapshot()
            .summary["total-data-files"]
        )
        < 15
    )


def test_a_compaction_that_would_lose_a_row_or_whose_files_are_gone_is_refused(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert", bookkeeper__rewrite_poll_interval="0.001")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(6), {}
    commit_batches(bookkeeper, transport, writer, rng, reference, 6)
    location = bookkeeper.catalog.load_table("shop.items").location()
    lossy = compacted_request(bookkeeper, drop_one_row=True)
    publish_rewrite(location, lossy)
    bookkeeper.run_cycle()
    assert "not in the new files" in (refusal(location, lossy.id) or "")
    good = compacted_request(bookkeeper)
    stale = good.model_copy(update={"id": uuid.uuid4().hex})  # the same files, replaced twice
    publish_rewrite(location, good)
    commit_batches(bookkeeper, transport, writer, rng, reference, 1)
    publish_rewrite(location, stale)
    commit_batches(bookkeeper, transport, writer, rng, reference, 1)
    assert refusal(location, good.id) is None and "no longer in the table" in (
        refusal(location, stale.id) or ""
    )
    assert not pending_rewrites(location)
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)
