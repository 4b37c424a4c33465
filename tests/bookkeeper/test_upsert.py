"""Upsert tables in the bookkeeper: one live row per key through position deletes, read alike by
pyiceberg and DuckDB, with the key index saved, caught up and rebuilt."""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import pytest

from icekeeper.bookkeeper.key_index_store import index_location, load_index
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.moniker import FileEntry
from icekeeper.common.transports import MonikerTransport, open_transport
from tests.support.shop_items import (
    SCHEMA,
    UpsertWriter,
    applied,
    bookkeeper_config,
    duckdb_rows,
    pyiceberg_rows,
    write_file,
)


def upsert_table_with(
    tmp_path: Path, keys: int, **overrides: str
) -> tuple[IcekeeperConfig, MonikerTransport, UpsertWriter, Bookkeeper]:
    """An upsert table whose keys 0..`keys`-1 hold
    themselves, committed by the bookkeeper returned."""
    config = bookkeeper_config(tmp_path, mode="upsert", **overrides)
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    transport.publish(writer.batch([(k, k) for k in range(keys)]))
    bookkeeper.run_cycle()
    return config, transport, writer, bookkeeper


def test_random_upserts_and_deletes_leave_one_row_per_key(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(3), {}
    for _cycle in range(12):
        # several monikers per snapshot: a key may change in two of them
        for _ in range(rng.randint(1, 3)):
            changes = []
            for _ in range(rng.randint(1, 40)):
                key = rng.randint(0, 60)
                amount = None if rng.random() < 0.25 else rng.randint(0, 10**6)
                changes.append((key, amount))
                if amount is None:
                    reference.pop(key, None)
                else:
                    reference[key] = amount
            transport.publish(writer.batch(changes))
        report = bookkeeper.run_cycle()
        assert not report.tables[0].quarantined
        assert pyiceberg_rows(bookkeeper) == reference
    assert duckdb_rows(bookkeeper) == reference
    table = bookkeeper.catalog.load_table("shop.items")
    # Through position deletes (the bookkeeper's purges may have dropped the files they were for
    # since: these files are tiny, and soon mostly deleted).
    added = [
        s.summary.additional_properties.get("added-position-deletes") for s in table.snapshots()
    ]
    assert sum(int(count or 0) for count in added) > 0


def test_a_key_changed_in_two_batches_of_one_snapshot(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    transport.publish(writer.batch([(1, 10), (2, 20)]))
    bookkeeper.run_cycle()
    transport.publish(writer.batch([(1, 11)]))
    transport.publish(writer.batch([(1, 12), (2, None)]))
    report = bookkeeper.run_cycle()
    assert len(report.tables[0].committed) == 2 and report.tables[0].rows_replaced == 3
    assert pyiceberg_rows(bookkeeper) == {1: 12} == duckdb_rows(bookkeeper)


def test_a_new_bookkeeper_starts_from_the_saved_index_and_catches_up(tmp_path: Path) -> None:
    config, transport, writer, first = upsert_table_with(tmp_path, 100)
    first.committer.close()  # a clean stop saves the index
    saved = load_index(first.catalog.load_table("shop.items"))
    assert saved is not None and saved.live_keys == 100
    # Another bookkeeper commits more (say the first one's successor) without saving.
    second = Bookkeeper(config)
    transport.publish(
        writer.batch([(k, -k) for k in range(50)] + [(k, None) for k in range(90, 100)])
    )
    second.run_cycle()
    # A third starts from the saved (now stale) index: it must replay the second's snapshot.
    third = Bookkeeper(config)
    transport.publish(writer.batch([(k, 7) for k in range(40, 60)]))
    third.run_cycle()
    expected = {k: (7 if 40 <= k < 60 else -k if k < 50 else k) for k in range(90)}
    assert pyiceberg_rows(third) == expected == duckdb_rows(third)


def test_a_starting_bookkeeper_has_its_key_index_ready_before_its_first_cycle(
    tmp_path: Path,
) -> None:
    config, transport, writer, first = upsert_table_with(tmp_path, 100)
    transport.publish(writer.batch([(k, None) for k in range(10)]))
    first.run_cycle()  # not saved: the next one catches up from the saved index or rebuilds
    second = Bookkeeper(config)
    assert second.committer.key_indexes.index_of("shop.items") is None
    second.warm_key_indexes()
    index = second.committer.key_indexes.index_of("shop.items")
    assert index is not None and index.live_keys == 90
    assert (
        index.snapshot_id == second.catalog.load_table("shop.items").current_snapshot().snapshot_id
    )


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_missing_or_corrupt_index_is_rebuilt_from_the_table(tmp_path: Path, damage: str) -> None:
    config, transport, writer, first = upsert_table_with(tmp_path, 30)
    transport.publish(writer.batch([(k, 100 + k) for k in range(10)] + [(29, None)]))
    first.run_cycle()
    first.committer.close()
    path = Path(
        index_location(first.catalog.load_table("shop.items").location()).removeprefix("file://")
    )
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    second = Bookkeeper(config)
    transport.publish(writer.batch([(k, 200 + k) for k in range(5, 15)]))
    second.run_cycle()
    expected = {k: (200 + k if 5 <= k < 15 else 100 + k if k < 10 else k) for k in range(29)}
    assert pyiceberg_rows(second) == expected == duckdb_rows(second)


def test_a_changelog_table_made_an_upsert_table_keeps_the_newest_row_per_key(
    tmp_path: Path,
) -> None:
    changelog = bookkeeper_config(tmp_path, mode="changelog")
    transport, writer, bookkeeper = (
        open_transport(changelog),
        UpsertWriter(changelog),
        Bookkeeper(changelog),
    )
    reference = {}
    for batch in ([(1, 10), (2, 20), (3, 30)], [(1, 11), (2, 21)], [(1, 12), (4, 40)]):
        transport.publish(writer.batch(batch))
        bookkeeper.run_cycle()
        reference.update(batch)
    assert len(bookkeeper.catalog.load_table("shop.items").scan().to_arrow()) == 7
    bookkeeper.committer.close()
    # The same table, now configured as an upsert table: the rebuilt index keeps each key's
    # newest row and the next commit deletes the older ones.
    upsert = bookkeeper_config(tmp_path, mode="upsert")
    mirror = Bookkeeper(upsert)
    transport.publish(writer.batch([(3, 31)]))
    report = mirror.run_cycle()
    reference[3] = 31
    assert report.tables[0].rows_replaced == 4
    assert pyiceberg_rows(mirror) == reference == duckdb_rows(mirror)


def test_a_deleted_keys_file_storage_cannot_serve_for_a_cycle_waits_and_loses_nothing(
    tmp_path: Path,
) -> None:
    config, transport, writer, bookkeeper = upsert_table_with(tmp_path, 10)
    deleting = writer.batch([(1, None), (2, 20)])
    transport.publish(deleting)
    transport.publish(
        writer.batch([(2, 21), (3, 30)])
    )  # the same writer's next batch must not overtake it
    keys_file = Path(deleting.delete_files[0].path.removeprefix("file://"))
    away = keys_file.with_name("away")
    keys_file.rename(away)  # read only for its keys: storage fails to serve it this cycle
    report = bookkeeper.run_cycle()
    assert not report.tables[0].committed and not report.tables[0].quarantined
    assert pyiceberg_rows(bookkeeper) == {k: k for k in range(10)}
    away.rename(keys_file)
    bookkeeper.run_cycle()
    expected = {**{k: k for k in range(10) if k != 1}, 2: 21, 3: 30}
    assert pyiceberg_rows(bookkeeper) == expected == duckdb_rows(bookkeeper)
    assert transport.dead_letter_count() == 0


def misnamed_deleted_keys(data_file: FileEntry, location: str) -> dict[str, list[FileEntry]]:
    """Deleted-keys entries of malformed monikers, by what is wrong with them. Every one but the
    size and row-count cases names a file whose size and row count it gives right: only where the
    file is (or that it is a data file) can condemn it."""
    outside = Path(location.removeprefix("file://")).parent / "other" / "keys.parquet"
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data_file.path.removeprefix("file://"), outside)
    state = Path(location.removeprefix("file://")) / "icekeeper" / "keys.parquet"
    state.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data_file.path.removeprefix("file://"), state)
    as_keys = data_file.model_copy(update={"content": "deleted-keys"})
    good = write_file(
        Path(location.removeprefix("file://")) / "data" / "keys" / "k.parquet",
        SCHEMA,
        [{"id": 0, "amount": None, "_kfk_partition": 0, "_kfk_offset": 0}],
    ).model_copy(update={"content": "deleted-keys"})
    return {
        "a data file of the table": [as_keys],
        "a parent folder": [
            as_keys.model_copy(update={"path": f"{location}/data/../../other/keys.parquet"})
        ],
        "outside the data folder": [as_keys.model_copy(update={"path": f"file://{state}"})],
        "a wrong size": [good.model_copy(update={"size_bytes": good.size_bytes + 1})],
        "a wrong row count": [good.model_copy(update={"record_count": 2})],
    }


def test_a_deleted_keys_entry_that_is_not_what_a_writer_writes_quarantines_its_moniker(
    tmp_path: Path,
) -> None:
    """A deleted-keys file deletes every key it holds: one named outside the table's data folder
    (also through `..`), with a size or row count its footer denies, or that is a data file of the
    table, quarantines its moniker with the reason and deletes no key."""
    config, transport, writer, bookkeeper = upsert_table_with(tmp_path, 10)
    table = bookkeeper.catalog.load_table("shop.items")
    [data_file] = [
        FileEntry(
            path=task.file.file_path,
            size_bytes=task.file.file_size_in_bytes,
            record_count=task.file.record_count,
        )
        for task in table.scan().plan_files()
    ]
    cases = misnamed_deleted_keys(data_file, table.location())
    reference = {k: k for k in range(10)}
    expected_reasons = {
        # An earlier batch's data file: outside this moniker's batch folder, so it is condemned
        # for where it is before its keys are read.
        "a data file of the table": "outside its moniker's batch folder",
        "a parent folder": "names a parent folder",
        "outside the data folder": "not under the table location's data folder",
        "a wrong size": "size",
        "a wrong row count": "rows",
    }
    for case, deleted in cases.items():
        changes = [(5, 50 + len(reference))]
        moniker = writer.batch(changes).model_copy(update={"delete_files": deleted})
        transport.publish(moniker)
        [result] = bookkeeper.run_cycle().tables
        assert not result.committed, case
        assert len(result.quarantined) == 1, (case, result)
        [(_, reason)] = result.quarantined
        assert expected_reasons[case] in reason, (case, reason)
        assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper), case
    # The writer's next batch commits: quarantines moved its chain on.
    transport.publish(writer.batch([(1, None), (2, 22)]))
    bookkeeper.run_cycle()
    assert pyiceberg_rows(bookkeeper) == {**{k: k for k in range(10) if k != 1}, 2: 22}
    assert transport.dead_letter_count() == len(cases)


def test_a_deleted_keys_file_of_another_batch_quarantines_its_moniker(tmp_path: Path) -> None:
    """A moniker's deleted-keys files belong to its own batch (`<location>/data/<writer>/<seq>`):
    one naming another batch's deleted-keys file, right in size and rows, would delete that
    batch's keys again (here a key inserted since) and leave with this batch's files. It is a
    dead letter with the reason, never committed; the writer's next batch commits."""
    config, transport, writer, bookkeeper = upsert_table_with(tmp_path, 10)
    deleting = writer.batch([(1, None)])
    transport.publish(deleting)
    bookkeeper.run_cycle()
    transport.publish(writer.batch([(1, 11)]))  # key 1 is back
    bookkeeper.run_cycle()
    borrowing = writer.batch([(2, 22)]).model_copy(update={"delete_files": deleting.delete_files})
    transport.publish(borrowing)
    [result] = bookkeeper.run_cycle().tables
    assert not result.committed
    [(_, reason)] = result.quarantined
    assert "outside its moniker's batch folder" in reason and f"seq {borrowing.seq}" in reason
    assert pyiceberg_rows(bookkeeper) == {**{k: k for k in range(10)}, 1: 11}
    assert transport.dead_letter_count() == 1
    transport.publish(writer.batch([(3, None)]))
    bookkeeper.run_cycle()
    assert pyiceberg_rows(bookkeeper) == {**{k: k for k in range(10) if k != 3}, 1: 11}


def test_a_deleted_keys_file_missing_past_the_timeout_quarantines_its_moniker(
    tmp_path: Path,
) -> None:
    """As a data file: storage says it does not exist for `missing_file_timeout`, then the moniker
    is a dead letter (before, it waited for ever, holding back its writer's later batches)."""
    config, transport, writer, bookkeeper = upsert_table_with(
        tmp_path, 10, bookkeeper__missing_file_timeout="0.5"
    )
    deleting = writer.batch([(1, None), (2, 20)])
    Path(deleting.delete_files[0].path.removeprefix("file://")).unlink()
    transport.publish(deleting)
    transport.publish(writer.batch([(3, 30)]))
    [result] = bookkeeper.run_cycle().tables
    assert not result.committed and not result.quarantined and result.unavailable
    time.sleep(0.6)
    [result] = bookkeeper.run_cycle().tables
    [(_, reason)] = result.quarantined
    assert "missing for" in reason
    assert pyiceberg_rows(bookkeeper) == {**{k: k for k in range(10)}, 3: 30}


def test_a_data_file_named_through_a_parent_folder_quarantines_its_moniker(tmp_path: Path) -> None:
    config, transport, writer, bookkeeper = upsert_table_with(tmp_path, 3)
    location = bookkeeper.catalog.load_table("shop.items").location()
    for name in ("../../elsewhere", "w1/.."):
        moniker = writer.batch([(7, 70)])
        [entry] = moniker.files
        real = Path(entry.path.removeprefix("file://"))
        moved = Path(os.path.normpath(f"{location.removeprefix('file://')}/data/{name}/f.parquet"))
        moved.parent.mkdir(parents=True, exist_ok=True)
        real.rename(moved)
        path = f"{location}/data/{name}/f.parquet"
        transport.publish(
            moniker.model_copy(update={"files": [entry.model_copy(update={"path": path})]})
        )
        [result] = bookkeeper.run_cycle().tables
        [(_, reason)] = result.quarantined
        assert "names a parent folder" in reason, name
    assert pyiceberg_rows(bookkeeper) == {k: k for k in range(3)}


def test_the_saved_key_index_names_only_files_with_live_keys(tmp_path: Path) -> None:
    """Every batch updates every key: each commit leaves the previous data file without a live
    row. The index saved beside the table (at every commit here) lists only the files live keys
    point into, not every file ever committed; the bookkeeper's purges still drop the dead files
    from the table; and a bookkeeper restarted from the saved index carries on exactly."""
    config, transport, writer, bookkeeper = upsert_table_with(
        tmp_path, 20, bookkeeper__key_index_save_interval="0"
    )
    reference = {k: k for k in range(20)}
    for cycle in range(1, 31):
        changes = [(k, 1000 * cycle + k) for k in range(20)]
        transport.publish(writer.batch(changes))
        [result] = bookkeeper.run_cycle().tables
        assert result.committed
        reference.update(changes)
    table = bookkeeper.catalog.load_table("shop.items")
    saved = load_index(table)
    assert saved is not None and saved.snapshot_id == table.current_snapshot().snapshot_id
    assert len(saved.files) <= 2, [ref.path for ref in saved.files]
    assert len(list(table.scan().plan_files())) <= 2, "dead data files left in the table"
    assert pyiceberg_rows(bookkeeper) == reference
    restarted = Bookkeeper(config)  # no clean stop: it starts from the index saved last
    changes = [(k, -k) for k in range(0, 20, 3)] + [(5, None)]
    transport.publish(writer.batch(changes))
    [result] = restarted.run_cycle().tables
    assert result.committed and not result.quarantined
    applied(reference, changes)
    assert pyiceberg_rows(restarted) == reference == duckdb_rows(restarted)
