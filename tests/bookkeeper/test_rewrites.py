"""The bookkeeper commits a compaction the reaper wrote while updates went on (no Spark here: the
compacted file is written from the table's live rows with pyarrow, as the reaper's Spark job
writes it): rows whose keys changed meanwhile are deleted again, the key index follows the rest,
and a compaction that would lose a row or replaces a file already gone is refused, not committed."""

from __future__ import annotations

import json
import random
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.bookkeeper.table_key_indexes import live_files
from icekeeper.common.delete_files import read_position_deletes
from icekeeper.common.locations import normalize_location
from icekeeper.common.rewrites import (
    REWRITE_ID_PROPERTY,
    RewriteRequest,
    is_pending,
    output_folder,
    pending_rewrite_folders,
    pending_rewrites,
    publish_rewrite,
    refusal,
    rewrites_folder,
    set_aside_reason,
)
from icekeeper.common.transports import open_transport
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


def live_rows_of(bookkeeper: Bookkeeper, paths: list[str]) -> list[dict]:
    """The live rows of data files `paths` of `shop.items`' current snapshot (their position
    deletes applied), read back from the files."""
    table = bookkeeper.catalog.load_table("shop.items")
    _, delete_files = live_files(table, table.current_snapshot())
    deleted: dict[str, set[int]] = {}
    for delete_file in delete_files:
        for path, position in zip(*read_position_deletes(delete_file.file_path)):
            deleted.setdefault(path, set()).add(int(position))
    return [
        row
        for path in paths
        for number, row in enumerate(pq.read_table(path.removeprefix("file://")).to_pylist())
        if number not in deleted.get(path, set())
    ]


def compacted_request(
    bookkeeper: Bookkeeper, drop_one_row: bool = False, replaced: list[str] | None = None
) -> RewriteRequest:
    """What the reaper hands over: every data file of the current snapshot (or those
    `replaced`), replaced by one file of their live rows (optionally missing one, a broken
    compaction)."""
    table = bookkeeper.catalog.load_table("shop.items")
    snapshot = table.current_snapshot()
    if replaced is None:
        replaced = [task.file.file_path for task in table.scan().plan_files()]
        rows = table.scan().to_arrow().to_pylist()
    else:
        rows = live_rows_of(bookkeeper, replaced)
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


def errors(bookkeeper: Bookkeeper, kind: str) -> float:
    return (
        bookkeeper.metrics.registry.get_sample_value("icekeeper_errors_total", {"kind": kind}) or 0
    )


def committed_by(bookkeeper: Bookkeeper, request_id: str) -> list[int]:
    table = bookkeeper.catalog.load_table("shop.items")
    return [
        s.snapshot_id
        for s in table.snapshots()
        if s.summary.additional_properties.get(REWRITE_ID_PROPERTY) == request_id
    ]


def dead_letters(config, capsys, *arguments: str) -> dict:
    """`icekeeper dead-letters <arguments> --rewrites --json` on `config` (no Kafka needed)."""
    from icekeeper.cli import build_parser
    from icekeeper.dead_letters import run_dead_letters

    args = build_parser().parse_args(["dead-letters", *arguments, "--rewrites", "--json"])
    assert run_dead_letters(config, args) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_request_whose_files_are_missing_holds_up_no_other_and_is_set_aside_after_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The reaper's compaction of some files, whose output file is gone, before a compaction of
    others: the second commits in the first poll all the same, the first waits, and once its file
    has been missing for `missing_file_timeout` it is set aside with the reason, its folder kept
    (and spared by orphan removal), listed by `dead-letters list --rewrites`; restored and
    replayed, it commits."""
    config = bookkeeper_config(
        tmp_path,
        mode="upsert",
        bookkeeper__rewrite_poll_interval="0.001",
        bookkeeper__missing_file_timeout="1",
        bookkeeper__purge_deleted_share="0",  # the compacted files stay as the requests read them
    )
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(26), {}
    commit_batches(bookkeeper, transport, writer, rng, reference, 6)
    table = bookkeeper.catalog.load_table("shop.items")
    location = table.location()
    files = sorted(task.file.file_path for task in table.scan().plan_files())
    stuck = compacted_request(bookkeeper, replaced=files[:3])
    good = compacted_request(bookkeeper, replaced=files[3:])
    [entry] = stuck.files
    stuck_file = Path(entry.path.removeprefix("file://"))
    away = stuck_file.with_name("away")
    stuck_file.rename(away)  # gone: storage says it does not exist
    publish_rewrite(location, stuck)
    time.sleep(0.01)  # listed oldest first: the stuck one before
    publish_rewrite(location, good)
    commit_batches(bookkeeper, transport, writer, rng, reference, 1)
    assert committed_by(bookkeeper, good.id) and not is_pending(location, good.id)
    assert is_pending(location, stuck.id) and refusal(location, stuck.id) is None
    assert errors(bookkeeper, "rewrite-failed") >= 1 and not errors(bookkeeper, "rewrite-set-aside")
    time.sleep(1.1)
    commit_batches(bookkeeper, transport, writer, rng, reference, 1)
    assert not is_pending(location, stuck.id) and refusal(location, stuck.id) is None
    assert "missing for" in (set_aside_reason(location, stuck.id) or "")
    assert errors(bookkeeper, "rewrite-set-aside") == 1
    assert normalize_location(stuck.output_folder) in pending_rewrite_folders(location)
    [listed] = dead_letters(config, capsys, "list")["rewrites"]
    assert listed["name"] == stuck.id and "missing for" in listed["reason"]
    assert pyiceberg_rows(bookkeeper) == reference
    away.rename(stuck_file)  # restored by the operator, who then replays it
    assert dead_letters(config, capsys, "replay")["rewrites"] == [stuck.id]
    assert dead_letters(config, capsys, "list")["rewrites"] == []
    commit_batches(bookkeeper, transport, writer, rng, reference, 1)
    assert committed_by(bookkeeper, stuck.id) and not is_pending(location, stuck.id)
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)


def test_a_request_whose_files_storage_fails_to_serve_is_never_set_aside(tmp_path: Path) -> None:
    """An outage (storage answers with an error, not "no such file") keeps the request pending
    past the timeout, however long; it commits once storage serves the file."""
    config = bookkeeper_config(
        tmp_path,
        mode="upsert",
        bookkeeper__rewrite_poll_interval="0.001",
        bookkeeper__missing_file_timeout="0.5",
        bookkeeper__purge_deleted_share="0",
    )
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(27), {}
    commit_batches(bookkeeper, transport, writer, rng, reference, 4)
    location = bookkeeper.catalog.load_table("shop.items").location()
    request = compacted_request(bookkeeper)
    publish_rewrite(location, request)
    reader = bookkeeper.committer.footer_reader
    describe = reader.describe

    def storage_error(requests, properties, sizes):
        """The request's file answers a storage error; the writers' files are read as ever."""
        from icekeeper.bookkeeper.datafiles import FileUnavailable

        failing = {entry.path for entry in request.files}
        described = describe([r for r in requests if r[0] not in failing], properties, sizes)
        for path, _, _ in requests:
            if path in failing:
                described[path] = FileUnavailable(f"{path}: storage error (503)")
        return described

    reader.describe = storage_error
    for _ in range(3):
        commit_batches(bookkeeper, transport, writer, rng, reference, 1)
        time.sleep(0.3)
    assert is_pending(location, request.id) and set_aside_reason(location, request.id) is None
    reader.describe = describe
    commit_batches(bookkeeper, transport, writer, rng, reference, 1)
    assert committed_by(bookkeeper, request.id)
    assert pyiceberg_rows(bookkeeper) == reference


def test_a_request_file_that_is_not_a_request_is_set_aside_and_the_queue_goes_on(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert", bookkeeper__rewrite_poll_interval="0.001")
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(28), {}
    commit_batches(bookkeeper, transport, writer, rng, reference, 3)
    location = bookkeeper.catalog.load_table("shop.items").location()
    folder = Path(rewrites_folder(location).removeprefix("file://"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "garbled.json").write_text('{"id": "garbled", "table": ')
    time.sleep(0.01)
    request = compacted_request(bookkeeper)
    publish_rewrite(location, request)
    commit_batches(bookkeeper, transport, writer, rng, reference, 1)
    assert committed_by(bookkeeper, request.id)
    assert "unreadable rewrite request" in (set_aside_reason(location, "garbled") or "")
    assert refusal(location, "garbled") is None and not is_pending(location, "garbled")
    assert pyiceberg_rows(bookkeeper) == reference


def test_a_request_that_keeps_failing_is_set_aside_and_an_outage_keeps_one_pending(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A request that fails every poll with an error that is no outage (here its file's footer
    breaks the reader) would be tried every poll for ever: after
    `bookkeeper.rewrite_failed_polls` polls it is set aside with the reason and counted. One
    whose storage is unreachable (a connection error) stays pending however many polls, and
    commits once storage answers."""
    config = bookkeeper_config(
        tmp_path,
        mode="upsert",
        bookkeeper__rewrite_poll_interval="0.001",
        bookkeeper__rewrite_failed_polls="3",
        bookkeeper__purge_deleted_share="0",
    )
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(29), {}
    commit_batches(bookkeeper, transport, writer, rng, reference, 4)
    table = bookkeeper.catalog.load_table("shop.items")
    location = table.location()
    files = sorted(task.file.file_path for task in table.scan().plan_files())
    broken = compacted_request(bookkeeper, replaced=files[:2])
    unreachable = compacted_request(bookkeeper, replaced=files[2:])
    publish_rewrite(location, broken)
    publish_rewrite(location, unreachable)
    reader = bookkeeper.committer.footer_reader
    describe = reader.describe
    broken_paths = {entry.path for entry in broken.files}
    unreachable_paths = {entry.path for entry in unreachable.files}

    def failing(requests, properties, sizes):
        paths = {path for path, _, _ in requests}
        if paths & broken_paths:
            raise ValueError("a footer this reader cannot parse")
        if paths & unreachable_paths:
            raise ConnectionError("storage unreachable")
        return describe(requests, properties, sizes)

    reader.describe = failing
    for poll in range(1, 6):
        commit_batches(bookkeeper, transport, writer, rng, reference, 1)
        assert is_pending(location, broken.id) == (poll < 3), poll
        assert is_pending(location, unreachable.id), poll
    reason = set_aside_reason(location, broken.id) or ""
    assert "failed 3 polls" in reason and "a footer this reader cannot parse" in reason
    assert set_aside_reason(location, unreachable.id) is None
    assert errors(bookkeeper, "rewrite-set-aside") == 1
    [listed] = dead_letters(config, capsys, "list")["rewrites"]
    assert listed["name"] == broken.id
    reader.describe = describe
    commit_batches(bookkeeper, transport, writer, rng, reference, 1)
    assert committed_by(bookkeeper, unreachable.id) and not committed_by(bookkeeper, broken.id)
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)


def test_a_request_whose_snapshot_cannot_be_built_is_set_aside_not_retried_as_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error while the snapshot is built, before anything is sent to the catalog, is no commit
    of unknown outcome and no lost compare-and-swap: nothing reached the catalog, so there is
    nothing to settle and nothing to plan again. Raised as it is, it counts towards
    `bookkeeper.rewrite_failed_polls` (one attempt per poll) and the request is set aside; taken
    for an unknown outcome it was planned again eight times a poll and, as a "conflict", an
    outage: pending for ever."""
    from icekeeper.bookkeeper import commit_path

    config = bookkeeper_config(
        tmp_path,
        mode="upsert",
        bookkeeper__rewrite_poll_interval="0.001",
        bookkeeper__rewrite_failed_polls="3",
        bookkeeper__purge_deleted_share="0",
    )
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(31), {}
    commit_batches(bookkeeper, transport, writer, rng, reference, 4)
    location = bookkeeper.catalog.load_table("shop.items").location()
    broken = compacted_request(bookkeeper)
    publish_rewrite(location, broken)
    rewrite_files = commit_path.rewrite_files
    built: list[str] = []

    def failing(transaction, properties, removed, added_deletes):
        built.append(properties[REWRITE_ID_PROPERTY])
        if properties[REWRITE_ID_PROPERTY] == broken.id:
            raise ValueError("a snapshot this table cannot take")
        return rewrite_files(transaction, properties, removed, added_deletes)

    monkeypatch.setattr(commit_path, "rewrite_files", failing)
    for poll in range(1, 5):
        commit_batches(bookkeeper, transport, writer, rng, reference, 1)
        assert built.count(broken.id) == min(poll, 3), poll  # one attempt a poll
        assert is_pending(location, broken.id) == (poll < 3), poll
    reason = set_aside_reason(location, broken.id) or ""
    assert "failed 3 polls" in reason and "a snapshot this table cannot take" in reason
    assert errors(bookkeeper, "rewrite-set-aside") == 1
    assert not committed_by(bookkeeper, broken.id)
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)


def test_a_locked_catalog_database_keeps_a_request_pending_and_never_sets_it_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SQL catalog's database not answering (SQLite's `database is locked` while another
    process holds the lock, a PostgreSQL server unreachable: SQLAlchemy's `OperationalError`) is an
    outage like storage not answering: it says nothing about the request, which stays pending
    however many polls it lasts, never set aside, and commits once the database answers."""
    import sqlite3

    from icekeeper.bookkeeper import rewrites

    database = tmp_path / "catalog.db"
    properties = {
        "type": "sql",
        # A short busy timeout: the lock is found at once, not after SQLite's five seconds.
        "uri": f"sqlite:///{database}?timeout=0.1",
        "warehouse": f"file://{tmp_path}/warehouse",
    }
    config = bookkeeper_config(
        tmp_path,
        mode="upsert",
        catalog__properties=json.dumps(properties),
        bookkeeper__rewrite_poll_interval="0.001",
        bookkeeper__rewrite_failed_polls="2",
        bookkeeper__purge_deleted_share="0",
    )
    transport, writer, bookkeeper = open_transport(config), UpsertWriter(config), Bookkeeper(config)
    rng, reference = random.Random(37), {}
    commit_batches(bookkeeper, transport, writer, rng, reference, 4)
    location = bookkeeper.catalog.load_table("shop.items").location()
    request = compacted_request(bookkeeper)
    publish_rewrite(location, request)
    listed = rewrites.pending_rewrites
    holder: list[sqlite3.Connection] = []

    def listed_then_locked(table_location: str):
        # Another process takes the database's lock once the poll has listed the requests.
        found = listed(table_location)
        connection = sqlite3.connect(database, isolation_level=None)
        connection.execute("BEGIN EXCLUSIVE")
        holder.append(connection)
        return found

    monkeypatch.setattr(rewrites, "pending_rewrites", listed_then_locked)
    for poll in range(1, 5):
        commit_batches(bookkeeper, transport, writer, rng, reference, 1)
        assert holder, "the poll ran"
        holder.pop().rollback()
        assert is_pending(location, request.id), poll
        assert set_aside_reason(location, request.id) is None, poll
    assert errors(bookkeeper, "rewrite-set-aside") == 0
    monkeypatch.setattr(rewrites, "pending_rewrites", listed)
    commit_batches(bookkeeper, transport, writer, rng, reference, 1)
    assert committed_by(bookkeeper, request.id) and not is_pending(location, request.id)
    assert pyiceberg_rows(bookkeeper) == reference == duckdb_rows(bookkeeper)
