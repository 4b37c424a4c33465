"""Errors outside one table's commit never stop the bookkeeper or the reaper: an unreachable
catalog (a SQLite catalog locked by another connection, as a busy or failing catalog database
answers), a commit report that cannot be written (a full disk: `/dev/full`), a reaper pass whose
table cannot be loaded. Each is retried or reported and the service lives on."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import load_table_or_none, open_catalog
from icekeeper.common.committed_state import committed_state
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.transports import open_transport
from icekeeper.reaper.service import Reaper
from tests.support.shop_items import (
    SCHEMA,
    azure_queue_settings,
    bookkeeper_config,
    make_moniker,
    write_file,
)
from tests.support.waiting import wait_until


def lockable_catalog_config(tmp_path: Path, **overrides: str) -> IcekeeperConfig:
    """A SQLite catalog that gives up on a lock after 0.2 s (instead of waiting 5 s)."""
    properties = f"{{type: sql, uri: 'sqlite:///{tmp_path}/catalog.db?timeout=0.2', warehouse: 'file://{tmp_path}/warehouse'}}"
    return bookkeeper_config(tmp_path, catalog__properties=properties, **overrides)


@contextlib.contextmanager
def catalog_unreachable(tmp_path: Path) -> Iterator[None]:
    """Another connection holds the catalog database's
    exclusive lock: every read and write fails."""
    holder = sqlite3.connect(tmp_path / "catalog.db", timeout=10)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.rollback()
        holder.close()


def errors(bookkeeper: Bookkeeper, kind: str) -> float:
    return (
        bookkeeper.metrics.registry.get_sample_value("icekeeper_errors_total", {"kind": kind})
        or 0.0
    )


def snapshot_count(config: IcekeeperConfig) -> int:
    table = load_table_or_none(open_catalog(config), "shop.items")
    return len(table.snapshots()) if table is not None else 0


def test_heartbeats_wait_out_an_unreachable_catalog(tmp_path: Path) -> None:
    config = lockable_catalog_config(tmp_path, bookkeeper__heartbeat_every_empty_cycles="1")
    open_transport(config).publish(make_moniker(config, 1, None, (0, 10)))
    bookkeeper = Bookkeeper(config)
    thread = threading.Thread(target=bookkeeper.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: snapshot_count(config) >= 2, 60, "the commit, then a heartbeat")
        with catalog_unreachable(tmp_path):
            wait_until(
                lambda: errors(bookkeeper, "heartbeat-failed") >= 3, 60, "three failed heartbeats"
            )
            assert thread.is_alive(), "the bookkeeper died with its catalog"
        before = snapshot_count(config)
        wait_until(lambda: snapshot_count(config) >= before + 2, 60, "heartbeats again")
        assert thread.is_alive()
    finally:
        bookkeeper.stop.set()
        thread.join(timeout=60)
    table = open_catalog(config).load_table("shop.items")
    assert committed_state(table).offsets == {("items", 0): 10}


def test_commit_reports_wait_out_a_full_disk(tmp_path: Path) -> None:
    report_path = tmp_path / "reports" / "commits.jsonl"
    report_path.parent.mkdir(parents=True)
    report_path.symlink_to("/dev/full")  # every write: "No space left on device"
    config = bookkeeper_config(tmp_path, bookkeeper__commit_report_path=str(report_path))
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    for seq in (1, 2):
        transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 10, seq * 10)))
        assert (
            bookkeeper.run_cycle().committed_monikers == 1
        )  # committed and acknowledged all the same
    assert transport.pending() == [] and errors(bookkeeper, "commit-report-failed") == 2
    report_path.unlink()  # space again
    transport.publish(make_moniker(config, 3, 2, (20, 30)))
    bookkeeper.run_cycle()
    lines = [json.loads(line) for line in report_path.read_text().splitlines()]
    table = open_catalog(config).load_table("shop.items")
    assert [line["snapshot_id"] for line in lines] == [
        s.snapshot_id for s in table.snapshots()
    ]  # none lost, in order
    assert [line["records"] for line in lines] == [10, 10, 10]


def test_a_reaper_pass_whose_tables_cannot_be_loaded_is_reported_and_the_next_one_runs(
    tmp_path: Path,
) -> None:
    config = lockable_catalog_config(tmp_path, catalog__name=f"cat_{uuid.uuid4().hex[:8]}")
    open_transport(config).publish(make_moniker(config, 1, None, (0, 10)))
    Bookkeeper(config).run_cycle()  # the table exists
    reaper = Reaper(config)
    passes = []
    thread = threading.Thread(
        target=reaper.run, kwargs={"every_s": 0.2, "on_pass": passes.append}, daemon=True
    )
    with catalog_unreachable(tmp_path):
        thread.start()
        wait_until(
            lambda: len(passes) >= 2 or not thread.is_alive(), 60, "two reaper passes (or its end)"
        )
        assert thread.is_alive(), "reaper --every died with its catalog"
        reaper.stop.set()
        thread.join(timeout=60)
    [table] = passes[0].tables
    assert table.table == "shop.items" and "database is locked" in table.errors[0]
    assert (
        json.loads(Path(config.reaper.report_path).read_text().splitlines()[0])["tables"][0][
            "errors"
        ]
        == table.errors
    )


@pytest.mark.integration
def test_file_events_wait_out_an_unreachable_catalog(local_stack, tmp_path: Path) -> None:
    from tests.support.event_grid import event_grid

    config = lockable_catalog_config(tmp_path, **azure_queue_settings(local_stack))
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    location = Path(
        open_catalog(config).load_table("shop.items").location().removeprefix("file://")
    )
    arrived = write_file(
        location / "data" / "external" / "f.parquet",
        SCHEMA,
        [{"id": 1000 + i, "amount": i, "_kfk_partition": 9, "_kfk_offset": i} for i in range(3)],
    )
    transport.queue.send_message(event_grid(arrived.path, "PutBlob", arrived.size_bytes))
    fresh = Bookkeeper(config)  # knows no table location yet: it must ask the catalog
    with catalog_unreachable(tmp_path):
        report = fresh.run_cycle()
        assert report.dead_lettered == [] and errors(fresh, "catalog-unavailable") == 1

    def cycle_with_the_event() -> bool:
        report = fresh.run_cycle()
        return bool(report.committed_monikers or report.tables)

    # The event becomes visible again after its lease.
    wait_until(cycle_with_the_event, 60, "the event delivered again", interval_s=0.5)
    ids = sorted(
        open_catalog(config).load_table("shop.items").scan().to_arrow().column("id").to_pylist()
    )
    assert ids == sorted(list(range(10)) + [1000, 1001, 1002])
    assert list(transport.dead_letter_queue.receive_messages()) == []


def test_a_holder_whose_cycles_fail_keeps_its_lease_through_the_outage(tmp_path: Path) -> None:
    """Failed cycles back off (the commit interval, doubling); the backoff grew past the lease's
    TTL (up to 30 s against the default 30 s TTL), so an outage of the transport or catalog let a
    standby take over (to meet the same outage) and, without one, made the holder take a new
    epoch after every failure. The holder renews first thing each cycle: it must keep its one
    epoch, and a standby stand by, until the outage ends and it commits."""
    from icekeeper.common.fencing import Lease, current_lease

    config = bookkeeper_config(
        tmp_path, bookkeeper__lease_ttl="3", bookkeeper__commit_interval="0.5"
    )
    transport_folder = tmp_path / "txlog"
    transport_folder.parent.mkdir(parents=True, exist_ok=True)
    transport_folder.write_text("not a folder: every listing of the transport fails")
    bookkeeper = Bookkeeper(config)
    thread = threading.Thread(target=bookkeeper.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: errors(bookkeeper, "cycle-failed") >= 1, 30, "a failed cycle")
        standby = Lease(config.group.lease_uri, config.group.name, ttl_s=3)
        with pytest.raises(TimeoutError):
            standby.acquire(timeout_s=8, poll_s=0.2)
        assert errors(bookkeeper, "cycle-failed") >= 4
        assert current_lease(config.group.lease_uri, config.group.name).epoch == 1
        transport_folder.unlink()
        open_transport(config).publish(make_moniker(config, 1, None, (0, 10)))
        wait_until(lambda: snapshot_count(config) >= 1, 30, "the commit after the outage")
        assert current_lease(config.group.lease_uri, config.group.name).epoch == 1
    finally:
        bookkeeper.stop.set()
        thread.join(timeout=60)
