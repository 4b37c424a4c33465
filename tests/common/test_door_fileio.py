"""pyiceberg opens the tables' files through the storage door on every store (issue 28, item 1):
metadata, manifest lists, manifests and data files, whether the bookkeeper writes them or pyiceberg
reads them back, on a local folder, S3 and Azure Blob alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common import door_fileio
from icekeeper.common.catalog import open_catalog
from icekeeper.common.door_fileio import DoorFileIO
from icekeeper.common.locations import normalize_location
from icekeeper.common.storage import storage_settings
from icekeeper.common.transports import open_transport
from tests.support.shop_items import bookkeeper_config, make_moniker


def test_pyiceberg_opens_every_file_of_a_table_through_the_door(
    store_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    door = door_fileio.open_filesystem

    def spying(location: str):
        opened.append(normalize_location(location))
        return door(location)

    monkeypatch.setattr(door_fileio, "open_filesystem", spying)
    root = store_root.rstrip("/")
    properties = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": root + "/warehouse" if "://" in root else f"file://{root}/warehouse",
        **storage_settings().mapping,
    }
    config = bookkeeper_config(
        tmp_path,
        catalog__properties=json.dumps(properties),
        transport__uri=f"{root}/txlog",
    )
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    assert bookkeeper.take_lease(timeout_s=5) == 1
    for seq in (1, 2):
        transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 5, seq * 5)))
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 2, report
    written = set(opened)

    table = open_catalog(config).load_table("shop.items")
    assert isinstance(table.io, DoorFileIO)
    opened.clear()
    assert sorted(table.scan().to_arrow()["_kfk_offset"].to_pylist()) == list(range(10))
    snapshot = table.current_snapshot()
    manifests = [manifest.manifest_path for manifest in snapshot.manifests(table.io)]
    data_files = table.inspect.files()["file_path"].to_pylist()
    read = set(opened)
    expected_reads = {snapshot.manifest_list, *manifests, *data_files}
    assert {normalize_location(path) for path in expected_reads} <= read
    # The bookkeeper wrote the table's metadata and manifests through the door as well.
    assert normalize_location(table.metadata_location) in written
    assert {normalize_location(path) for path in manifests} <= written
