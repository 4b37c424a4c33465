"""Compaction of an upsert table applies its deletes, and the bookkeeper's key index follows the
rows to their new files. While the bookkeeper keeps updating the same files, Iceberg refuses the
rewrite (new position deletes for a replaced file): nothing is lost or resurrected, and the
compaction lands once the files are quiet. Compaction that lands *during* updates needs the
bookkeeper to move the new deletes onto the rewritten files (issue 13, item 6: not done yet)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from bookkeeper.service import Bookkeeper
from common.transports import open_transport
from icekeeper.readers import duckdb_rows, spark_rows
from reaper.service import Reaper
from tests.bookkeeper.fixtures import UpsertWriter
from tests.conftest import register_catalog
from tests.reaper.test_reaper import reaper_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]

KEYS = 300


def random_changes(rng: random.Random, count: int) -> list[tuple[int, int | None]]:
    return [(rng.randrange(KEYS), None if rng.random() < 0.15 else rng.randrange(10**6)) for _ in range(count)]


def applied(reference: dict[int, int], changes: list[tuple[int, int | None]]) -> None:
    for key, amount in changes:
        if amount is None:
            reference.pop(key, None)
        else:
            reference[key] = amount


def commit(bookkeeper: Bookkeeper, transport, writer: UpsertWriter, changes: list, reference: dict) -> None:  # noqa: ANN001
    """Publish one batch and cycle until it is committed (a cycle may lose to the reaper's commits)."""
    moniker = writer.batch(changes)
    transport.publish(moniker)
    for _ in range(20):
        if any(d.moniker.id == moniker.id for table in bookkeeper.run_cycle().tables for d in table.committed):
            applied(reference, changes)
            return
    raise AssertionError("a batch was never committed")


def live_rows(rows: list[dict]) -> dict[int, int]:
    keys = [row["id"] for row in rows]
    assert len(keys) == len(set(keys)), "a key has two live rows"
    return {row["id"]: row["amount"] for row in rows}


def test_compaction_applies_deletes_while_updates_continue(spark, tmp_path: Path) -> None:
    config = reaper_config(tmp_path, mode="upsert", reaper__compact_delete_ratio="0.1", reaper__commit_attempts="1",
                           bookkeeper__keep_snapshots="50")
    register_catalog(spark, config)
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(11), {}
    for _ in range(25):
        commit(bookkeeper, transport, writer, random_changes(rng, 60), reference)
    table = bookkeeper.catalog.load_table("shop.items")
    assert int(table.current_snapshot().summary["total-position-deletes"]) > 0

    stop = threading.Event()
    failure: list[BaseException] = []

    def keep_updating() -> None:
        try:
            while not stop.is_set():
                commit(bookkeeper, transport, writer, random_changes(rng, 40), reference)
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            failure.append(error)

    updater = threading.Thread(target=keep_updating)
    updater.start()
    try:
        Reaper(config, spark=spark).run_pass()
    finally:
        stop.set()
        updater.join(timeout=120)
    assert not failure, failure
    table = bookkeeper.catalog.load_table("shop.items")
    assert live_rows(table.scan().to_arrow().to_pylist()) == reference, "an update was lost or a row resurrected"
    # Quiet files: the rewrite lands; the bookkeeper's index learns the rows' new places from it.
    [table_report] = Reaper(config, spark=spark).run_pass().tables
    assert not table_report.errors and table_report.files_compacted > 0
    # After the pass: more updates of the same keys, which must find the rows in their new files.
    for _ in range(5):
        commit(bookkeeper, transport, writer, random_changes(rng, 80), reference)
    table = bookkeeper.catalog.load_table("shop.items")
    assert live_rows(table.scan().to_arrow().to_pylist()) == reference
    assert live_rows(duckdb_rows(table, "id, amount")) == reference
    assert live_rows(spark_rows(spark, config, "shop.items", "id, amount")) == reference
