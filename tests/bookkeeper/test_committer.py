"""The bookkeeper's exactly-once commits, on a real SQLite catalog and real Parquet files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from icekeeper.bookkeeper.commit_path import StaleEpoch
from icekeeper.bookkeeper.committer import Committer
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.committed_state import committed_state
from icekeeper.common.transports import open_transport
from tests.support.shop_items import SCHEMA, bookkeeper_config, make_moniker


def rows_of(bookkeeper: Bookkeeper) -> list[tuple[int, int]]:
    arrow = bookkeeper.catalog.load_table("shop.items").scan().to_arrow()
    return sorted(
        zip(arrow.column("_kfk_partition").to_pylist(), arrow.column("_kfk_offset").to_pylist())
    )


def test_a_writers_monikers_commit_in_order_whatever_order_they_arrive_in(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    third, first, second = (
        make_moniker(config, 3, 2, (20, 30)),
        make_moniker(config, 1, None, (0, 10)),
        make_moniker(config, 2, 1, (10, 20)),
    )
    bookkeeper = Bookkeeper(config)
    transport.publish(third)
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 0 and report.pending == 1  # waits for its predecessors
    transport.publish(first)
    transport.publish(second)
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 3 and len(report.tables[0].committed) == 3
    assert rows_of(bookkeeper) == [(0, o) for o in range(30)]
    state = committed_state(bookkeeper.catalog.load_table("shop.items"))
    assert state.writer_seqs == {"w1": 3} and state.offsets == {("items", 0): 30}
    assert transport.pending() == []
    # One snapshot for the cycle, whatever number of monikers it held.
    assert len(bookkeeper.catalog.load_table("shop.items").snapshots()) == 1


def test_duplicates_and_replays_are_acknowledged_without_committing_twice(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    moniker = make_moniker(config, 1, None, (0, 10))
    transport.publish(moniker)
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    transport.publish(moniker)  # a writer that resent it, or a crash before the acknowledgement
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 0 and len(report.tables[0].duplicates) == 1
    assert len(rows_of(bookkeeper)) == 10 and transport.pending() == []


def test_crash_between_commit_and_acknowledgement_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    for seq in range(1, 4):
        transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 10, seq * 10)))
    crashed = Bookkeeper(config)
    result = crashed.committer.commit_table("shop.items", [d for d in crashed.transport.receive()])
    assert len(result.committed) == 3  # committed, then "died" before acknowledging anything
    assert len(transport.pending()) == 3
    restarted = Bookkeeper(config)
    report = restarted.run_cycle()
    assert report.committed_monikers == 0 and len(report.tables[0].duplicates) == 3
    assert len(rows_of(restarted)) == 30 and transport.pending() == []


def test_the_exactly_once_check_runs_again_inside_the_retry(tmp_path: Path) -> None:
    """Another bookkeeper commits the same moniker between our read and our compare-and-swap."""
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    Bookkeeper(config).run_cycle()  # creates the table
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    ours, theirs = Bookkeeper(config), Bookkeeper(config)
    deliveries = ours.transport.receive()
    original = ours.committer.commit_path.compare_and_swap
    raced = []

    def commit_after_the_other(changes):
        if not raced:
            raced.append(theirs.committer.commit_table("shop.items", theirs.transport.receive()))
        return original(changes)

    ours.committer.commit_path.compare_and_swap = commit_after_the_other
    result = ours.committer.commit_table("shop.items", deliveries)
    assert raced[0].snapshot_id is not None and len(raced[0].committed) == 1
    assert result.attempts == 2 and result.committed == [] and len(result.duplicates) == 1
    assert len(rows_of(ours)) == 20


def test_a_stale_epoch_cannot_commit(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    newer = Bookkeeper(config, epoch=2)
    newer.run_cycle()
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    stale = Bookkeeper(config, epoch=1)
    with pytest.raises(StaleEpoch, match="epoch 2"):
        stale.run_cycle()
    assert len(rows_of(newer)) == 10 and len(transport.pending()) == 1


def test_a_commit_with_unknown_outcome_is_settled_by_reading_the_table_back(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    original = bookkeeper.committer.commit_path.compare_and_swap

    def lost_response(changes):
        original(changes)
        raise TimeoutError("catalog connection lost after the commit was sent")

    bookkeeper.committer.commit_path.compare_and_swap = lost_response
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 1 and report.tables[0].attempts == 1
    assert len(rows_of(bookkeeper)) == 20 and transport.pending() == []


def test_schema_evolves_before_newer_files_and_an_incompatible_change_is_quarantined(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    wider = Schema(
        *[
            NestedField(2, "amount", LongType(), required=False) if f.field_id == 2 else f
            for f in SCHEMA.fields
        ],
        NestedField(5, "note", StringType(), required=False),
        identifier_field_ids=[1],
    )
    transport.publish(make_moniker(config, 2, 1, (10, 20), schema=wider))
    clashing = Schema(
        *[
            NestedField(2, "amount", StringType(), required=False) if f.field_id == 2 else f
            for f in SCHEMA.fields
        ],
        identifier_field_ids=[1],
    )
    transport.publish(
        make_moniker(config, 1, None, (0, 5), writer_id="w2", partition=1, schema=clashing)
    )
    transport.publish(make_moniker(config, 2, 1, (5, 9), writer_id="w2", partition=1))
    bookkeeper = Bookkeeper(config)
    report = bookkeeper.run_cycle()
    table = bookkeeper.catalog.load_table("shop.items")
    assert str(table.schema().find_field("amount").field_type) == "long"
    assert table.schema().find_field("note").field_id == 5
    [(delivery, reason)] = report.tables[0].quarantined
    assert delivery.moniker.writer_id == "w2" and "cannot become string" in reason
    # The others flowed: w1's two monikers, and w2's next
    # one (its chain continues past the quarantined one).
    assert len(rows_of(bookkeeper)) == 24
    dead = list((tmp_path / "dead-letter" / "monikers").glob("*.reason"))
    assert len(dead) == 1 and "cannot become string" in json.loads(dead[0].read_text())["reason"]
    assert committed_state(table).quarantined_records == 5


def test_files_that_do_not_match_their_moniker_are_quarantined(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    moniker = make_moniker(config, 1, None, (0, 10))
    Path(moniker.files[0].path.removeprefix("file://")).write_bytes(b"truncated")
    transport.publish(moniker)
    report = Bookkeeper(config).run_cycle()
    [(_, reason)] = report.tables[0].quarantined
    assert "size" in reason or "unreadable" in reason


def test_an_unreadable_moniker_goes_to_the_dead_letter_folder_after_its_attempts(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(tmp_path, bookkeeper__max_attempts="2")
    broken = tmp_path / "txlog" / "shop.items" / "w1" / "000000000001-x.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{nope")
    bookkeeper = Bookkeeper(config)
    assert bookkeeper.run_cycle().dead_lettered == []
    assert [source for source, _ in bookkeeper.run_cycle().dead_lettered] == [str(broken)]
    assert not broken.exists() and list((tmp_path / "dead-letter" / "monikers").glob("*.reason"))


def test_budget_splits_a_backlog_over_commits(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path, bookkeeper__max_files_per_commit="2")
    transport = open_transport(config)
    for seq in range(1, 6):
        transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 4, seq * 4)))
    bookkeeper = Bookkeeper(config)
    assert [bookkeeper.run_cycle().committed_monikers for _ in range(3)] == [2, 2, 1]
    assert len(rows_of(bookkeeper)) == 20


def test_the_committer_reports_watermark_and_counts(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10), partition=0))
    transport.publish(make_moniker(config, 1, None, (0, 30), writer_id="w2", partition=1))
    result = Committer(config, Bookkeeper(config).catalog).commit_table(
        "shop.items", open_transport(config).receive()
    )
    assert (result.records, result.files) == (40, 2)
    assert (
        result.watermark_ms == 1_700_000_000_000 + 10
    )  # the slower partition holds the watermark back


def test_a_moniker_the_store_cannot_read_for_a_while_waits_and_is_never_dead_lettered_empty(
    tmp_path: Path,
) -> None:
    """An I/O error reading a moniker (a disk error, S3 throttling a GET) is an outage, not bad
    input: it must not be dead-lettered (with no bytes, since they could not be read) and deleted
    after `max_attempts` cycles; once the store answers again the moniker commits."""
    config = bookkeeper_config(tmp_path, bookkeeper__max_attempts="2")
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    [published] = (tmp_path / "txlog").rglob("*.json")
    kept = tmp_path / "kept.json"
    published.rename(kept)
    # A file whose every read fails with EIO, where the moniker was.
    published.symlink_to("/proc/self/mem")
    bookkeeper = Bookkeeper(config)
    for _ in range(3):
        try:
            report = bookkeeper.run_cycle()
        except OSError:
            continue  # the cycle failed on the outage: the service retries it
        assert report.dead_lettered == []
    assert published.is_symlink(), "the moniker was deleted while the store could not read it"
    assert not list((tmp_path / "dead-letter" / "monikers").glob("*.reason"))
    published.unlink()
    kept.rename(published)
    assert bookkeeper.run_cycle().committed_monikers == 1
    assert rows_of(bookkeeper) == [(0, o) for o in range(10)]
