"""Upsert tables in the bookkeeper: one live row per key through position deletes, read alike by
pyiceberg and DuckDB, with the key index saved, caught up and rebuilt."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bookkeeper.key_index_store import index_location, load_index
from bookkeeper.service import Bookkeeper
from common.config import IcekeeperConfig
from common.transports import MonikerTransport, open_transport
from tests.support.shop_items import UpsertWriter, bookkeeper_config, duckdb_rows, pyiceberg_rows


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
    assert second.committer.upserts.index_of("shop.items") is None
    second.warm_key_indexes()
    index = second.committer.upserts.index_of("shop.items")
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
