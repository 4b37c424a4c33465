"""Every file the roles share, on each store the storage door opens (local, S3, Azure Blob).

Monikers and their dead letters, a writer's claims on the batch folders it fills, its data files,
the upsert key index, rewrite requests and their marks: each written and read back through the
modules the writer, the bookkeeper and the reaper use, with nothing but the door configured, as
on nodes that share no folder. Their URIs keep the form they were given (Spark reads the
`abfss://<container>@<account>...` form only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icekeeper.bookkeeper.key_index import KeyIndex, pack
from icekeeper.bookkeeper.key_index_store import load_index_at, save_index_at
from icekeeper.bookkeeper.position_deletes import DataFileRef
from icekeeper.common.arrow_parquet import write_files
from icekeeper.common.config.model import TxLogTransport
from icekeeper.common.in_flight import InFlightClaims, live_claimed_folders
from icekeeper.common.locations import normalize_location
from icekeeper.common.rewrites import (
    RewriteRequest,
    commit_attempted,
    mark_commit_attempt,
    output_folder,
    pending_rewrite_folders,
    pending_rewrites,
    publish_rewrite,
    refusal,
    refuse_rewrite,
    rewrites_folder,
    set_aside_rewrite,
    set_aside_rewrites,
)
from icekeeper.common.storage import list_files, open_filesystem
from icekeeper.common.transports.txlog import TxLogMonikerTransport
from tests.support.moniker_values import sample_moniker
from tests.support.shop_items import SCHEMA, write_file_at
from tests.support.waiting import wait_until


def moniker_for_test(seq: int, table_location: str):
    """A moniker of writer `w1` for `shop.items` naming files under `table_location`."""
    moniker = sample_moniker(seq, seq - 1 or None, table="shop.items")
    files = [
        entry.model_copy(update={"path": f"{table_location}/data/w1/{seq:012d}/f{index}.parquet"})
        for index, entry in enumerate(moniker.files)
    ]
    return moniker.model_copy(update={"files": files})


def test_monikers_are_published_received_dead_lettered_and_replayed(store_root: str) -> None:
    transport = TxLogMonikerTransport(
        TxLogTransport(uri=f"{store_root}/txlog", dead_letter_uri=f"{store_root}/dead-letter")
    )
    monikers = [moniker_for_test(seq, f"{store_root}/warehouse/shop/items") for seq in (1, 2, 3)]
    for moniker in monikers:
        transport.publish(moniker)
    deliveries = transport.receive()
    assert [d.moniker.seq for d in deliveries] == [1, 2, 3]
    assert [m.seq for m in transport.pending("shop.items")] == [1, 2, 3]
    transport.acknowledge(deliveries[0])
    transport.dead_letter(deliveries[1], "a reason")
    [quarantined] = transport.quarantined()
    assert (quarantined.reason, quarantined.moniker) == ("a reason", monikers[1])
    transport.replay(quarantined)
    assert [m.seq for m in transport.pending()] == [2, 3]
    assert transport.dead_letter_count() == 0


def test_acknowledged_moniker_files_are_deleted_together(store_root: str) -> None:
    """What a bookkeeper's cycle acknowledges goes at once (S3: one request); a file already
    gone (acknowledged by a cycle that died before it finished) counts as deleted."""
    transport = TxLogMonikerTransport(
        TxLogTransport(uri=f"{store_root}/txlog", dead_letter_uri=f"{store_root}/dead-letter")
    )
    for seq in range(1, 6):
        transport.publish(moniker_for_test(seq, f"{store_root}/warehouse/shop/items"))
    deliveries = transport.receive()
    transport.acknowledge_all(deliveries[:3])
    assert [m.seq for m in transport.pending()] == [4, 5]
    transport.acknowledge_all(deliveries[:4])
    assert [m.seq for m in transport.pending()] == [5]


def test_claims_protect_a_batch_folder_until_released(store_root: str) -> None:
    table = f"{store_root}/warehouse/shop/items"
    batch = f"{table}/data/w1/000000000001-abcd"
    claims = InFlightClaims("w1", heartbeat_s=0.2)
    try:
        claims.claim(table, batch)
        assert live_claimed_folders(table, grace_s=30) == {normalize_location(batch)}
        [claim] = list_files(f"{table}/data/_in_flight")
        wait_until(  # the heartbeat rewrites it
            lambda: list_files(f"{table}/data/_in_flight")[0].mtime > claim.mtime,
            10,
            "the claim to be rewritten",
        )
        claims.release([batch])
        assert live_claimed_folders(table, grace_s=30) == set()
    finally:
        claims.close()


def test_data_files_keep_the_uri_form_of_their_folder(store_root: str) -> None:
    folder = f"{store_root}/warehouse/shop/items/data/w1/000000000001-abcd"
    rows = pa.table({"id": pa.array(range(10), pa.int64())})
    [written] = write_files(rows, folder, 0, 100, {}, folder="day=2026-11-26")
    assert written.path.startswith(f"{folder}/day=2026-11-26/part-00000-")
    assert written.record_count == 10
    filesystem, path = open_filesystem(written.path)
    with filesystem.open_input_file(path) as handle:
        assert pq.read_table(handle)["id"].to_pylist() == list(range(10))
    entry = write_file_at(f"{folder}/shop.parquet", SCHEMA, [{"id": 1, "amount": 2}])
    assert entry.path == f"{folder}/shop.parquet" and entry.record_count == 1


def test_the_key_index_is_saved_and_loaded_whole(store_root: str) -> None:
    table = f"{store_root}/warehouse/shop/items"
    files = [DataFileRef(f"{table}/data/w1/1/a.parquet", 0, ())]
    saved = KeyIndex(
        exact=True,
        files=files,
        snapshot_id=7,
        hi=np.zeros(3, np.uint64),
        lo=np.array([1, 2, 3], np.uint64),
        location=pack(0, np.array([0, 1, 2])),
    )
    save_index_at(table, "uuid-1", saved)
    save_index_at(table, "uuid-1", saved)  # replaced whole, nothing left beside it
    loaded = load_index_at(table, "uuid-1")
    assert loaded is not None and loaded.snapshot_id == 7 and loaded.files == files
    assert loaded.lo.tolist() == [1, 2, 3]
    assert [info.base_name for info in list_files(f"{table}/icekeeper")] == ["key-index.parquet"]
    assert load_index_at(table, "another-table") is None


def test_rewrite_requests_and_their_marks(store_root: str) -> None:
    table = f"{store_root}/warehouse/shop/items"
    requests = [
        RewriteRequest(
            table="shop.items",
            base_snapshot_id=1,
            replaced=[f"{table}/data/w1/1/a.parquet"],
            files=[],
            schema=SCHEMA.model_dump(),
            output_folder=output_folder(table, request_id),
            id=request_id,
        )
        for request_id in ("r1", "r2", "r3")
    ]
    for request in requests:
        publish_rewrite(table, request)
    assert {r.id for r in pending_rewrites(table)} == {"r1", "r2", "r3"}
    mark_commit_attempt(table, "r1")
    assert commit_attempted(table, "r1") and not commit_attempted(table, "r2")
    refuse_rewrite(table, "r2", "base snapshot expired")
    assert refusal(table, "r2") == "base snapshot expired"
    set_aside_rewrite(table, "r3", "files missing", request=requests[2])
    assert [entry.request_id for entry in set_aside_rewrites(table)] == ["r3"]
    assert [r.id for r in pending_rewrites(table)] == ["r1"]
    assert pending_rewrite_folders(table) == {
        normalize_location(output_folder(table, "r1")),
        normalize_location(output_folder(table, "r3")),
    }


def test_a_rewrite_request_storage_cannot_serve_keeps_orphan_removal_off(tmp_path: Path) -> None:
    """The reaper spares the output folders of pending rewrite requests. One the store could not
    serve (an I/O error, S3 throttling a GET) was left out of them, unread: its compacted files,
    not in any snapshot yet, were then orphans to remove. The folders cannot be known, so the
    reaper must skip orphan removal this pass (as for an unreadable claim)."""
    table = str(tmp_path / "warehouse" / "shop" / "items")
    for request_id in ("r1", "r2"):
        publish_rewrite(
            table,
            RewriteRequest(
                table="shop.items",
                base_snapshot_id=1,
                replaced=[f"{table}/data/w1/1/a.parquet"],
                files=[],
                schema=SCHEMA.model_dump(),
                output_folder=output_folder(table, request_id),
                id=request_id,
            ),
        )
    request_file = Path(rewrites_folder(table)) / "r2.json"
    request_file.unlink()
    request_file.symlink_to("/proc/self/mem")  # every read: EIO
    with pytest.raises(OSError, match="r2"):
        pending_rewrite_folders(table)
