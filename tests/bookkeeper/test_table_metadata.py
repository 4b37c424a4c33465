"""The bookkeeper's metadata shortcuts (bookkeeper/table_metadata.py)
against pyiceberg's own path: the same metadata files, the same metadata
after updates, and no stale table after another process commits."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from pyiceberg.serializers import ToOutputFile
from pyiceberg.table.update import update_table_metadata

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.bookkeeper.table_metadata import update_without_copy
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
