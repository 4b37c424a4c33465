"""The reaper on a real local table through Spark's Iceberg actions, with a bookkeeper committing
at the same time: compaction, expiry and orphan removal never lose rows or pending files."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from icekeeper.bench.reaper import age_files, files_under
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import default_table_location, open_catalog
from icekeeper.common.in_flight import InFlightClaims, claims_folder
from icekeeper.common.locations import normalize_location
from icekeeper.common.transports import open_transport
from icekeeper.readers import duckdb_rows, spark_rows
from icekeeper.reaper.service import Reaper
from tests.support.pipeline import register_catalog
from tests.support.shop_items import (
    GRACE_S,
    SCHEMA,
    committed_chain,
    make_moniker,
    reaper_config,
    write_file,
)
from tests.support.small_files import small_file_table

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def rows(table) -> Counter:
    arrow = (
        table.refresh().scan(selected_fields=("_kfk_partition", "_kfk_offset", "amount")).to_arrow()
    )
    return Counter(
        zip(
            *(
                arrow.column(name).to_pylist()
                for name in ("_kfk_partition", "_kfk_offset", "amount")
            )
        )
    )


def reachable(table) -> set[str]:
    """Every file a snapshot of the table reaches:
    metadata, manifest lists, manifests, live files."""
    paths = {
        table.metadata_location,
        *(entry.metadata_file for entry in table.metadata.metadata_log),
    }
    for snapshot in table.snapshots():
        paths.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            paths.add(manifest.manifest_path)
            paths.update(
                entry.data_file.file_path
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
            )
    return {normalize_location(path) for path in paths}


def exercise_reaper_under_load(spark, tmp_path: Path, files: int) -> None:
    config = reaper_config(tmp_path)
    table = small_file_table(spark, config, files)
    before = rows(table)
    assert len(table.snapshots()) == files and sum(before.values()) == files
    transport = open_transport(config)
    # A moniker that stays pending (its writer's seq 1
    # never arrives), with files as old as any orphan.
    pending = make_moniker(config, 2, 1, (0, 5), writer_id="late", partition=7)
    transport.publish(pending)
    age_files([entry.path for entry in pending.files], 3600)
    orphan = write_file(
        Path(table.location().removeprefix("file://")) / "data" / "crashed-writer" / "f.parquet",
        SCHEMA,
        [{"id": 1}],
    )
    age_files([orphan.path], 3600)

    stop, appended = threading.Event(), Counter()
    bookkeeper = Bookkeeper(config)

    def keep_committing() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            moniker = make_moniker(
                config, seq, seq - 1 or None, ((seq - 1) * 3, seq * 3), partition=0
            )
            transport.publish(moniker)
            for cycle_result in bookkeeper.run_cycle().tables:
                for delivery in cycle_result.committed:
                    appended.update(
                        (0, o, o)
                        for r in delivery.moniker.offsets
                        for o in range(r.from_offset, r.until_offset)
                    )
            # Ten commits a second, ten times the default commit interval. Back to back (a commit
            # takes milliseconds since the bookkeeper's lean metadata path) a compaction group
            # could lose every retry: a bookkeeper never commits faster than its interval.
            stop.wait(0.1)

    committer = threading.Thread(target=keep_committing)
    committer.start()
    reaper = Reaper(config, spark=spark)
    try:
        report = reaper.run_pass()
    finally:
        stop.set()
        committer.join(timeout=120)
    assert not committer.is_alive()
    for cycle_result in bookkeeper.run_cycle().tables:  # whatever was published last
        for delivery in cycle_result.committed:
            appended.update(
                (0, o, o)
                for r in delivery.moniker.offsets
                for o in range(r.from_offset, r.until_offset)
            )
    [table_report] = report.tables
    assert not table_report.errors
    assert table_report.files_compacted >= files and table_report.snapshots_expired >= files - 2
    assert len(appended) > 0, "the bookkeeper committed while the reaper ran"

    # Failed commit attempts during the pass leave fresh unreachable files; once older than the
    # grace period, a second pass (bookkeeper stopped) removes them. The sleep is the point: the
    # grace is the files' age on disk.
    time.sleep(GRACE_S + 1)
    assert not reaper.run_pass().tables[0].errors
    table = table.refresh()
    assert rows(table) == before + appended
    pending_paths = {normalize_location(entry.path) for entry in pending.files}
    on_disk = {normalize_location(path) for path in files_under(table.location())}
    live = reachable(table)
    assert {p for p in live if "/data/" in p} <= on_disk, "a live data file was deleted"
    assert on_disk == (live & on_disk) | pending_paths
    assert normalize_location(orphan.path) not in on_disk and pending_paths <= on_disk


def test_reaper_compacts_expires_and_cleans_while_the_bookkeeper_commits(
    spark, tmp_path: Path
) -> None:
    exercise_reaper_under_load(spark, tmp_path, files=120)


@pytest.mark.heavy
def test_reaper_on_1000_files_and_snapshots_while_the_bookkeeper_commits(
    spark, tmp_path: Path
) -> None:
    exercise_reaper_under_load(spark, tmp_path, files=1000)


def test_a_pending_monikers_file_survives_and_is_committed_later(spark, tmp_path: Path) -> None:
    config = reaper_config(tmp_path)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    bookkeeper.run_cycle()  # creates the table
    register_catalog(spark, config)
    waiting = make_moniker(config, 3, 2, (20, 30))  # seq 2 is late
    transport.publish(waiting)
    bookkeeper.run_cycle()
    age_files([entry.path for entry in waiting.files], 3600)
    dry = Reaper(config, spark=spark).run_pass(dry_run=True)
    assert not any(str(Path(waiting.files[0].path).name) in line for line in dry.tables[0].planned)
    report = Reaper(config, spark=spark).run_pass()
    assert (
        report.tables[0].orphans_spared == 1
        and Path(waiting.files[0].path.removeprefix("file://")).exists()
    )
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    assert bookkeeper.run_cycle().committed_monikers == 2
    table = open_catalog(config).load_table("shop.items")
    offsets = sorted(table.scan(selected_fields=("_kfk_offset",)).to_arrow().column(0).to_pylist())
    assert offsets == list(range(30))


def test_a_folder_a_writer_still_fills_survives_however_old_its_files(
    spark, tmp_path: Path
) -> None:
    """A batch that outlives the grace: its first files are old, unreferenced and not yet named by
    any moniker (the long chaos run lost one this way before writers claimed their folders)."""
    config = reaper_config(tmp_path)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    bookkeeper.run_cycle()  # creates the table
    register_catalog(spark, config)
    location = default_table_location(config, "shop.items")
    claims = InFlightClaims("w1", heartbeat_s=1)
    slow_folder = f"{location}/data/w1/{2:012d}"
    claims.claim(location, slow_folder)
    slow = make_moniker(config, 2, 1, (10, 20))  # its files, in the claimed folder
    age_files([entry.path for entry in slow.files], 3600)
    dead_folder = Path(location.removeprefix("file://")) / "data" / "w9" / "1"
    InFlightClaims("w9", heartbeat_s=3600).claim(
        location, str(dead_folder)
    )  # a writer that died mid-batch
    dead_file = write_file(dead_folder / "f.parquet", SCHEMA, [{"id": 1}])
    claims_on_disk = Path(claims_folder(location).removeprefix("file://"))
    [dead_claim] = claims_on_disk.glob("1-*.json")
    age_files([dead_file.path], 3600)
    age_files([str(dead_claim)], GRACE_S + 60)  # not rewritten since its writer died
    try:
        report = Reaper(config, spark=spark).run_pass()
        assert not report.tables[0].errors
        assert all(Path(entry.path.removeprefix("file://")).exists() for entry in slow.files)
        assert report.tables[0].orphans_spared == len(slow.files)
        assert not Path(dead_file.path.removeprefix("file://")).exists(), (
            "a stale claim protects nothing"
        )
        assert [claim.name.split("-")[0] for claim in claims_on_disk.glob("*.json")] == [
            f"{2:012d}"
        ], "the stale claim is removed"
        transport.publish(slow)
    finally:
        claims.close()
    assert bookkeeper.run_cycle().committed_monikers == 1
    table = open_catalog(config).load_table("shop.items")
    assert sorted(
        table.scan(selected_fields=("_kfk_offset",)).to_arrow().column(0).to_pylist()
    ) == list(range(20))


def test_spark_and_duckdb_read_the_same_rows_after_a_pass(spark, tmp_path: Path) -> None:
    config = reaper_config(tmp_path)
    table = small_file_table(spark, config, 30)
    columns, order = "_kfk_partition, _kfk_offset, amount", "_kfk_offset"
    duck_before, spark_before = (
        duckdb_rows(table, columns, order),
        spark_rows(spark, config, "shop.items", columns, order),
    )
    assert duck_before == spark_before and len(duck_before) == 30
    report = Reaper(config, spark=spark).run_pass()
    assert not report.tables[0].errors
    assert report.tables[0].files_compacted == 30 and report.tables[0].snapshots_expired >= 29
    table = table.refresh()
    assert len(list(table.scan().plan_files())) == 1
    assert (
        duckdb_rows(table, columns, order)
        == spark_rows(spark, config, "shop.items", columns, order)
        == duck_before
    )


def test_retention_drops_whole_files_of_old_rows(spark, tmp_path: Path) -> None:
    config = reaper_config(tmp_path, reaper__retention="7d", reaper__retention_column="_kfk_offset")
    now_ms = int(time.time() * 1000)
    old, new = (
        [now_ms - 10 * 86_400_000 + i for i in range(8)],
        [now_ms - 60_000 + i for i in range(4)],
    )
    table = small_file_table(spark, config, 12, offsets=old + new)
    report = Reaper(config, spark=spark).run_pass()
    assert (
        report.tables[0].retention_rows_deleted == 8
        and report.tables[0].retention_files_deleted == 8
    )
    assert sorted(table.refresh().scan().to_arrow().column("_kfk_offset").to_pylist()) == new


def test_dry_run_changes_nothing(spark, tmp_path: Path) -> None:
    config = reaper_config(tmp_path)
    table = small_file_table(spark, config, 12)
    orphan = write_file(
        Path(table.location().removeprefix("file://")) / "data" / "x" / "orphan.parquet",
        SCHEMA,
        [{"id": 1}],
    )
    age_files([orphan.path], 3600)
    on_disk, snapshots = files_under(table.location()), len(table.snapshots())
    report = Reaper(config, spark=spark).run_pass(dry_run=True)
    planned = report.tables[0].planned
    assert any(line.startswith("compaction:") for line in planned) and any(
        "orphan.parquet" in line for line in planned
    )
    assert any(line.startswith("expiry: 10 snapshots") for line in planned)
    assert (
        files_under(table.location()) == on_disk and len(table.refresh().snapshots()) == snapshots
    )


def test_expiry_keeps_the_newest_snapshot_with_the_committed_state(spark, tmp_path: Path) -> None:
    config = reaper_config(tmp_path, reaper__retain_last="1")
    transport, bookkeeper = committed_chain(config, 3)
    register_catalog(spark, config)
    reaper = Reaper(config, spark=spark)
    first = (
        reaper.run_pass()
    )  # compaction adds a snapshot without icekeeper's state; expiry keeps 1
    assert first.tables[0].files_compacted == 3 and not first.tables[0].errors
    table = open_catalog(config).load_table("shop.items")
    kept = {s.snapshot_id for s in table.snapshots()}
    assert table.current_snapshot().summary.operation.value == "replace" and len(kept) == 2
    from icekeeper.common.committed_state import committed_state

    state = committed_state(table)
    assert state.writer_seqs == {"w1": 3} and state.snapshot_id in kept
    # The bookkeeper carries on from that state: the next moniker neither waits nor repeats.
    transport.publish(make_moniker(config, 4, 3, (30, 40)))
    assert bookkeeper.run_cycle().committed_monikers == 1
    offsets = sorted(
        open_catalog(config)
        .load_table("shop.items")
        .scan()
        .to_arrow()
        .column("_kfk_offset")
        .to_pylist()
    )
    assert offsets == list(range(40))


def test_expiry_keeps_the_commit_a_rolled_back_table_is_checked_against(
    spark, tmp_path: Path
) -> None:
    """A table rolled back under icekeeper, then compacted and expired by the reaper: the commit
    rolled back to is kept (the committed-state property is checked against it), so the
    bookkeeper still refuses, and carries on exactly once the table is moved back."""
    from icekeeper.common.committed_state import StateNotInLineage, committed_state

    config = reaper_config(tmp_path, reaper__retain_last="1")
    transport, bookkeeper = committed_chain(config, 3)
    table = open_catalog(config).load_table("shop.items")
    newest = table.current_snapshot().snapshot_id
    second = table.current_snapshot().parent_snapshot_id
    table.manage_snapshots().rollback_to_snapshot(second).commit()
    register_catalog(spark, config)
    result = Reaper(config, spark=spark).run_pass()
    assert result.tables[0].files_compacted == 2 and not result.tables[0].errors
    table = open_catalog(config).load_table("shop.items")
    assert table.current_snapshot().summary.operation.value == "replace"
    assert {second, newest} <= {s.snapshot_id for s in table.snapshots()}
    with pytest.raises(StateNotInLineage):
        committed_state(table)
    transport.publish(make_moniker(config, 4, 3, (30, 40)))
    assert bookkeeper.run_cycle().committed_monikers == 0

    table.manage_snapshots().set_current_snapshot(newest).commit()
    assert bookkeeper.run_cycle().committed_monikers == 1
    table = open_catalog(config).load_table("shop.items")
    assert sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist()) == list(range(40))


def test_compaction_is_limited_to_the_filter_columns_day(spark, tmp_path: Path) -> None:
    """Seed 000: `compact.filter.column` with
    `compact.day.offset` 0 compacts yesterday's data only."""
    config = reaper_config(
        tmp_path,
        reaper__compact_filter_column="_kfk_offset",
        reaper__compact_day_offset="0",
        reaper__snapshot_expire_time="30d",
        reaper__max_manifests="5",
    )
    today = int(time.time() // 86400) * 86400 * 1000
    yesterday = [today - 86_400_000 + 3_600_000 * i for i in range(6)]
    table = small_file_table(
        spark, config, 12, offsets=yesterday + [today + 1000 * i for i in range(6)]
    )
    dry = Reaper(config, spark=spark).run_pass(dry_run=True).tables[0].planned
    assert any(line.startswith("manifests: rewrite 12 manifests") for line in dry)
    report = Reaper(config, spark=spark).run_pass()
    assert report.tables[0].files_compacted == 6 and report.tables[0].files_added == 1
    assert report.tables[0].manifests_rewritten > 0 and not report.tables[0].errors
    files = list(table.refresh().scan().plan_files())
    assert len(files) == 7 and sum(task.file.record_count for task in files) == 12


def test_a_maintenance_commit_that_loses_every_retry_is_redone_from_a_fresh_read(
    spark, tmp_path: Path
) -> None:
    """A bookkeeper committing back to back can win all of Iceberg's own commit retries (CI saw an
    expiry fail so); the reaper redoes such a step, and only such a step, up to
    `commit_attempts`."""
    from icekeeper.reaper.maintenance import is_commit_conflict

    config = reaper_config(tmp_path, reaper__commit_attempts="3")
    table = small_file_table(spark, config, 2)
    maintenance = Reaper(config, spark=spark).maintenance
    jvm = spark.sparkContext._jvm
    errors: list[BaseException] = []

    def set_property_against_a_concurrent_commit() -> None:
        # One compare-and-swap at the catalog, without Iceberg's own refresh-and-retry around it,
        # so that a commit landing in between fails it as surely as four in a row would.
        operations = maintenance._java_table("shop.items").operations()
        base = operations.refresh()
        if (
            not errors
        ):  # the first attempt: another committer (pyiceberg) lands between read and commit
            table.refresh().transaction().set_properties(
                {"bookkeeper.test": "won"}
            ).commit_transaction()
        properties = jvm.java.util.HashMap()
        properties.put("reaper.test", "done")
        try:
            operations.commit(
                base,
                jvm.org.apache.iceberg.TableMetadata.buildFrom(base)
                .setProperties(properties)
                .build(),
            )
        except Exception as error:
            errors.append(error)
            raise

    maintenance._until_committed("shop.items", "test", set_property_against_a_concurrent_commit)
    assert len(errors) == 1 and is_commit_conflict(errors[0])
    table = table.refresh()
    assert (
        table.properties["reaper.test"] == "done" and table.properties["bookkeeper.test"] == "won"
    )

    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise RuntimeError("not a conflict")

    with pytest.raises(RuntimeError):
        maintenance._until_committed("shop.items", "test", broken)
    assert len(calls) == 1 and not is_commit_conflict(RuntimeError("CommitFailedException"))

    # A compaction whose file group lost its commit raises Iceberg's plain RuntimeException
    # (partial-progress.max-failed-commits=0). Losing that race on purpose is not deterministic,
    # so the JVM exception is built here with the message the Iceberg 1.11 action formats.
    lost_group = jvm.java.lang.RuntimeException(
        "partial-progress.enabled is true but 1 rewrite commits failed. This is more than the "
        "maximum allowed failures of 0."
    )
    wrapped = type("Py4JError", (Exception,), {})()
    wrapped.java_exception = jvm.org.apache.spark.SparkException("job aborted", lost_group)
    assert is_commit_conflict(wrapped)


@pytest.mark.integration
def test_a_stopped_reaper_does_not_wait_for_a_lease_store_that_hangs(
    tmp_path: Path, s3_storage
) -> None:
    """A scheduled reaper taking its pass's lease from a store that accepts the request and never
    answers (every S3 call of its config through the test relay, the lease's stalled) waited out
    the client's timeouts after SIGTERM. Told to stop (as its signal handler does), its loop ends
    within a second or so, its pass skipped without the lease."""
    import yaml

    from icekeeper.common.config import load_config
    from tests.bookkeeper.test_fencing import s3_bookkeeper_config
    from tests.support.object_stores import storage_door
    from tests.support.relay import Relay, containing, stall

    relay = Relay(s3_storage.pyiceberg_properties()["s3.endpoint"])
    settings = s3_bookkeeper_config(tmp_path, s3_storage).model_dump(mode="json")
    settings["catalog"]["properties"]["s3.endpoint"] = relay.address
    config_path = tmp_path / "reaper.yaml"
    config_path.write_text(yaml.safe_dump(settings), encoding="utf-8")
    passes = []
    try:
        with storage_door(settings["catalog"]["properties"]):  # as it was, afterwards
            reaper = Reaper(load_config(config_path, environ={}))
            relay.arm(containing(b"leases"), stall(), times=1000)
            loop = threading.Thread(
                target=reaper.run, kwargs={"every_s": 60, "on_pass": passes.append}, daemon=True
            )
            loop.start()
            deadline = time.monotonic() + 120
            while relay.faulted == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert relay.faulted, "the reaper never asked for its lease"
            time.sleep(1.0)  # hung for a while
            told = time.monotonic()
            reaper.stop.set()
            loop.join(30)
            seconds = time.monotonic() - told
            assert not loop.is_alive(), "still waiting for the lease store 30 s after the stop"
    finally:
        relay.close()
    assert seconds < 2.0, f"{seconds:.1f} s after the stop"
    assert reaper.state == "stopped"
    assert [report.skipped for report in passes] == [["stopped before the pass took its lease"]]
