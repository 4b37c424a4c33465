"""The bookkeeper's metadata shortcuts (bookkeeper/table_metadata.py)
against pyiceberg's own path: the same metadata files, the same metadata
after updates, and no stale table after another process commits."""

from __future__ import annotations

import gc
import json
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError
from pyiceberg.catalog.rest import TableResponse
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table import CommitTableResponse
from pyiceberg.table.update import update_table_metadata

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.bookkeeper.table_metadata import SnapshotReuse, update_without_copy
from icekeeper.common.catalog import open_catalog
from icekeeper.common.transports import open_transport
from tests.support.shop_items import bookkeeper_config, make_moniker


def commit(bookkeeper: Bookkeeper, config, seq: int) -> None:
    open_transport(config).publish(
        make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 5, seq * 5))
    )
    assert bookkeeper.run_cycle().committed_monikers == 1


def assert_pyiceberg_would_write_the_same(table, tmp_path: Path) -> None:
    ours = json.loads(Path(table.metadata_location.removeprefix("file://")).read_text())
    theirs = tmp_path / f"pyiceberg-{uuid.uuid4().hex}.metadata.json"
    ToOutputFile.table_metadata(table.metadata, table.io.new_output(str(theirs)))
    assert ours == json.loads(theirs.read_text())


def test_metadata_files_are_pyiceberg_s_json_and_updates_pyiceberg_s_metadata(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(
        tmp_path, bookkeeper__keep_snapshots="3", bookkeeper__keep_snapshots_for="0"
    )
    bookkeeper = Bookkeeper(config)
    for seq in range(1, 7):  # expiry runs too (keep 3, no age)
        commit(bookkeeper, config, seq)
    table = bookkeeper.catalog.load_table("shop.items")
    assert len(table.snapshots()) == 3
    assert_pyiceberg_would_write_the_same(table, tmp_path)  # after an expiry
    previous = table.metadata.snapshots[0]
    # The updates of one more commit, applied both ways.
    commit(bookkeeper, config, 7)
    updated = bookkeeper.catalog.load_table("shop.items")
    snapshot = updated.current_snapshot()
    from pyiceberg.table.update import (
        AddSnapshotUpdate,
        RemoveSnapshotsUpdate,
        SetSnapshotRefUpdate,
    )

    updates = (
        RemoveSnapshotsUpdate(snapshot_ids=[previous.snapshot_id]),
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=snapshot.snapshot_id),
    )
    theirs = update_table_metadata(
        table.metadata, updates, metadata_location=table.metadata_location
    )
    lean = update_without_copy(table.metadata, updates, metadata_location=table.metadata_location)
    assert lean.model_dump(exclude={"last_updated_ms"}) == theirs.model_dump(
        exclude={"last_updated_ms"}
    )


def test_a_table_committed_by_another_process_is_read_again(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    bookkeeper = Bookkeeper(config)
    commit(bookkeeper, config, 1)
    cache = bookkeeper.catalog.metadata_cache
    parsed = cache.parsed
    for seq in range(2, 5):
        commit(bookkeeper, config, seq)
        assert_pyiceberg_would_write_the_same(
            open_catalog(config).load_table("shop.items"), tmp_path
        )  # one snapshot more each
    assert cache.parsed == parsed, "the bookkeeper parsed the metadata files it wrote itself"
    other = open_catalog(config).load_table("shop.items")
    other.manage_snapshots().create_tag(
        other.current_snapshot().snapshot_id, "by-someone-else"
    ).commit()
    table = bookkeeper.catalog.load_table("shop.items")
    assert "by-someone-else" in table.metadata.refs and cache.parsed == parsed + 1
    commit(bookkeeper, config, 5)
    table = open_catalog(config).load_table("shop.items")
    assert "by-someone-else" in table.metadata.refs and len(table.snapshots()) == 5
    assert sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist()) == list(range(25))


def metadata_answer(snapshots: list[dict], table_uuid: str) -> dict:
    """A REST catalog's commit answer: a format-2 table's metadata listing `snapshots`."""
    current = snapshots[-1]["snapshot-id"]
    return {
        "metadata-location": f"s3://warehouse/t/metadata/{uuid.uuid4()}.metadata.json",
        "metadata": {
            "format-version": 2,
            "table-uuid": table_uuid,
            "location": "s3://warehouse/t",
            "last-sequence-number": snapshots[-1]["sequence-number"],
            "last-updated-ms": snapshots[-1]["timestamp-ms"],
            "last-column-id": 1,
            "current-schema-id": 0,
            "schemas": [
                {
                    "type": "struct",
                    "schema-id": 0,
                    "fields": [{"id": 1, "name": "id", "required": False, "type": "long"}],
                }
            ],
            "default-spec-id": 0,
            "partition-specs": [{"spec-id": 0, "fields": []}],
            "last-partition-id": 999,
            "default-sort-order-id": 0,
            "sort-orders": [{"order-id": 0, "fields": []}],
            "properties": {"icekeeper.committed-state": "{}"},
            "current-snapshot-id": current,
            "refs": {"main": {"snapshot-id": current, "type": "branch"}},
            "snapshots": snapshots,
            "snapshot-log": [
                {"snapshot-id": s["snapshot-id"], "timestamp-ms": s["timestamp-ms"]}
                for s in snapshots
            ],
            "metadata-log": [],
        },
    }


def snapshot_json(number: int) -> dict:
    snapshot = {
        "snapshot-id": 1000 + number,
        "sequence-number": number,
        "timestamp-ms": 1_700_000_000_000 + number,
        "manifest-list": f"s3://warehouse/t/metadata/snap-{1000 + number}.avro",
        "summary": {"operation": "append", "added-records": str(number)},
        "schema-id": 0,
    }
    if number > 1:
        snapshot["parent-snapshot-id"] = 1000 + number - 1
    return snapshot


def test_rest_answers_reuse_unchanged_snapshots_and_equal_pyiceberg_s_parse() -> None:
    """Commit answers with snapshots added, expired and rewritten by the server (the parent id of
    an expired one dropped) parse to pyiceberg's own result, reusing exactly the snapshots whose
    JSON is unchanged; a snapshot listed again after an answer without it is built anew (only
    the latest answer's snapshots are kept)."""
    reuse, table_uuid = SnapshotReuse(), str(uuid.uuid4())

    def parse(answer: dict, model=CommitTableResponse):
        text = json.dumps(answer)
        parsed = reuse.parse(model, text)
        theirs = model.model_validate_json(text)
        # Equal either way round, though ours looks snapshots up from the newest end.
        assert parsed == theirs and theirs == parsed and parsed.metadata == theirs.metadata
        assert type(parsed.metadata).__name__ == "_NewestFirstMetadataV2"
        newest = parsed.metadata.snapshots[-1]
        assert parsed.metadata.snapshot_by_id(newest.snapshot_id) is newest
        return {s.snapshot_id: s for s in parsed.metadata.snapshots}

    first = parse(metadata_answer([snapshot_json(n) for n in range(1, 6)], table_uuid))
    # Snapshot 6 added, 1 and 2 expired, 3 rewritten without its parent (2, expired).
    listed = [snapshot_json(n) for n in range(3, 7)]
    del listed[0]["parent-snapshot-id"]
    second = parse(metadata_answer(listed, table_uuid))
    assert [second[i] is first[i] for i in (1004, 1005)] == [True, True]
    assert second[1003] is not first[1003] and second[1003].parent_snapshot_id is None
    # A load's answer (`TableResponse`) reuses the commit's snapshots alike.
    loaded = parse(metadata_answer(listed, table_uuid), TableResponse)
    assert all(loaded[i] is second[i] for i in (1003, 1004, 1005, 1006))
    # 4 is expired by this answer, then listed again by the next: built anew, not kept.
    without_four = [s for s in listed if s["snapshot-id"] != 1004]
    parse(metadata_answer(without_four, table_uuid))
    again = parse(metadata_answer(listed, table_uuid))
    assert again[1004] is not second[1004] and again[1005] is second[1005]
    # Another table with the same snapshot ids shares nothing.
    other = parse(metadata_answer(listed, str(uuid.uuid4())))
    assert not any(other[i] is again[i] for i in other)


def test_rest_answers_this_path_cannot_take_get_pyiceberg_s_result_or_error() -> None:
    reuse = SnapshotReuse()
    answer = metadata_answer([snapshot_json(1)], str(uuid.uuid4()))
    del answer["metadata"]["snapshots"][0]["manifest-list"]
    for text in (json.dumps(answer), "{not json"):
        with pytest.raises(ValidationError) as ours:
            reuse.parse(CommitTableResponse, text)
        with pytest.raises(ValidationError) as theirs:
            CommitTableResponse.model_validate_json(text)
        assert ours.value.errors() == theirs.value.errors()


def test_rest_answers_of_tables_no_longer_answered_are_let_go_and_fallbacks_are_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A table dropped or no longer served must not keep its snapshots (~20 MB at 3,600) for
    the process's life; an answer left to pyiceberg's parse is counted and logged once, so a fast
    path that stopped applying is seen."""
    reuse = SnapshotReuse()
    reuse.TABLES = 2
    tables = [str(uuid.uuid4()) for _ in range(3)]
    parsed = {
        table: reuse.parse(
            CommitTableResponse, json.dumps(metadata_answer([snapshot_json(1)], table))
        )
        for table in tables
    }
    again = {
        table: reuse.parse(
            CommitTableResponse, json.dumps(metadata_answer([snapshot_json(1)], table))
        )
        for table in tables[1:]
    }
    for table in tables[1:]:  # kept: reused
        assert again[table].metadata.snapshots[0] is parsed[table].metadata.snapshots[0]
    first = reuse.parse(
        CommitTableResponse, json.dumps(metadata_answer([snapshot_json(1)], tables[0]))
    )
    assert first.metadata.snapshots[0] is not parsed[tables[0]].metadata.snapshots[0]  # let go
    assert reuse.fallbacks == 0
    with caplog.at_level("WARNING", logger="icekeeper.bookkeeper.table_metadata"):
        for _ in range(2):
            with pytest.raises(ValidationError):
                reuse.parse(CommitTableResponse, "{not json")
    assert reuse.fallbacks == 2
    assert [r.message for r in caplog.records].count(
        "a REST catalog answer is parsed by pyiceberg alone (slower at long histories)"
    ) == 1


def test_parsing_a_long_history_sets_off_no_garbage_collection_while_it_runs() -> None:
    """An answer of 3,600 snapshots is ~100,000 lists and dicts: parsed with the collector on, it
    set off some 30 collections (in a bookkeeper's heap, now and then a full one of 150-220 ms,
    inside the commit). None now, and the collector is on again after (off, if it was off)."""
    reuse, table_uuid = SnapshotReuse(), str(uuid.uuid4())
    texts = [
        json.dumps(
            metadata_answer([snapshot_json(n) for n in range(first, first + 3600)], table_uuid)
        )
        for first in (1, 2)
    ]
    collections: list[int] = []

    def observe(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(observe)
    try:
        for text in texts:
            reuse.parse(CommitTableResponse, text)
        assert len(collections) <= 2 * len(texts) and gc.isenabled()
        gc.disable()
        try:
            reuse.parse(CommitTableResponse, texts[0])
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        gc.callbacks.remove(observe)
