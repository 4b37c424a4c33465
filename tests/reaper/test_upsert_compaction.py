"""Compaction of an upsert table lands while the bookkeeper keeps updating the same files: the
reaper writes the compacted files, the bookkeeper commits them and deletes again the rows whose
keys changed meanwhile, and its key index follows the live rows to their new files. Nothing is
lost or resurrected, and later updates find the rows in the new files."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from bookkeeper.service import Bookkeeper
from common.transports import open_transport
from icekeeper.readers import duckdb_rows, spark_rows
from reaper.service import Reaper
from tests.support.pipeline import register_catalog
from tests.support.shop_items import UpsertWriter, reaper_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]

KEYS = 300


def random_changes(rng: random.Random, count: int) -> list[tuple[int, int | None]]:
    return [
        (rng.randrange(KEYS), None if rng.random() < 0.15 else rng.randrange(10**6))
        for _ in range(count)
    ]


def applied(reference: dict[int, int], changes: list[tuple[int, int | None]]) -> None:
    for key, amount in changes:
        if amount is None:
            reference.pop(key, None)
        else:
            reference[key] = amount


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


def live_rows(rows: list[dict]) -> dict[int, int]:
    keys = [row["id"] for row in rows]
    assert len(keys) == len(set(keys)), "a key has two live rows"
    return {row["id"]: row["amount"] for row in rows}


def test_compaction_lands_while_updates_continue(spark, tmp_path: Path) -> None:
    config = reaper_config(
        tmp_path,
        mode="upsert",
        reaper__compact_delete_ratio="0.1",
        bookkeeper__keep_snapshots="200",
        bookkeeper__rewrite_poll_interval="0.5",
        reaper__rewrite_wait="120",
    )
    register_catalog(spark, config)
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(11), {}
    for _ in range(25):
        commit(bookkeeper, transport, writer, random_changes(rng, 60), reference)
    table = bookkeeper.catalog.load_table("shop.items")
    assert int(table.current_snapshot().summary["total-position-deletes"]) > 0
    files_before = int(table.current_snapshot().summary["total-data-files"])

    stop = threading.Event()
    failure: list[BaseException] = []
    batches_during_pass = [0]

    def keep_updating() -> None:
        try:
            while not stop.is_set():
                commit(bookkeeper, transport, writer, random_changes(rng, 40), reference)
                batches_during_pass[0] += 1
                # Twenty commits a second, not back to back: the reaper's expiry commits through
                # Iceberg's optimistic retries too, and a committer with no pause at all could win
                # every one of them (a fresh-clone CI run failed so).
                stop.wait(0.05)
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            failure.append(error)

    updater = threading.Thread(target=keep_updating)
    updater.start()
    try:
        [table_report] = Reaper(config, spark=spark).run_pass().tables
    finally:
        stop.set()
        updater.join(timeout=120)
    assert not failure, failure
    assert not table_report.errors, table_report.errors
    assert table_report.files_compacted > 0 and batches_during_pass[0] > 0, (
        table_report,
        batches_during_pass,
    )
    table = bookkeeper.catalog.load_table("shop.items")
    [rewrite] = [
        s
        for s in table.snapshots()
        if s.summary and "icekeeper.rewrite-id" in s.summary.additional_properties
    ]
    # Updates committed while the reaper wrote its files: their keys' rows in the new files are
    # stale, and the rewrite snapshot deletes them (the remapping this test is about).
    assert int(rewrite.summary["added-position-deletes"]) > 0, rewrite.summary
    assert (
        int(table.current_snapshot().summary["total-data-files"])
        < files_before + batches_during_pass[0]
    )
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
