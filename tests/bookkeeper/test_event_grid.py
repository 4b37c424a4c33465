"""Event Grid intake (seed 003): Parquet files that arrive on the storage queue without a moniker.

Azurite has no Event Grid, so the tests post the messages Event Grid would deliver (its event
schema, base64 as its queue handler sends them, or CloudEvents as plain JSON) to a real Azurite
queue. Their URLs name local files, because the table lives on local disk here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from icekeeper.bookkeeper.event_grid_files import event_file_path
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import open_catalog
from icekeeper.common.file_events import location_key, parse_event_grid
from icekeeper.common.transports import open_transport
from tests.support.event_grid import cloud_event, event_grid
from tests.support.shop_items import (
    SCHEMA,
    UpsertWriter,
    azure_queue_settings,
    bookkeeper_config,
    make_moniker,
    pyiceberg_rows,
    write_file,
)


def test_event_urls_of_blob_and_adls_name_the_same_location() -> None:
    forms = [
        "https://acct.blob.core.windows.net/lake/db/t/data/f.parquet",
        "https://acct.dfs.core.windows.net/lake/db/t/data/f.parquet",
        "abfss://lake@acct.dfs.core.windows.net/db/t/data/f.parquet",
        "wasbs://lake@acct.blob.core.windows.net/db/t/data/f.parquet",
    ]
    assert {location_key(form) for form in forms} == {"acct/lake/db/t/data/f.parquet"}
    assert (
        location_key("file:///x/t/f.parquet") == location_key("/x/t/f.parquet") == "/x/t/f.parquet"
    )
    # pyarrow opens the file through the table location's own scheme.
    assert event_file_path(forms[0], "abfss://lake@acct.dfs.core.windows.net/db/t") == forms[2]


def test_only_complete_parquet_blobs_count() -> None:
    url = "https://acct.blob.core.windows.net/lake/t/data/f.parquet"
    assert parse_event_grid(event_grid(url, "FlushWithClose", 10)).file.url == url
    assert parse_event_grid(cloud_event(url, "PutBlob", 10)).file.size_bytes == 10
    ignored = [
        event_grid(url, "CreateFile", 0),
        event_grid(url, "PutBlob", 0),  # a block upload's empty first blob: its blocks follow
        event_grid(url.replace(".parquet", ".crc"), "PutBlob", 1),
        event_grid(url, "DeleteFile", None, event_type="Microsoft.Storage.BlobDeleted"),
    ]
    for message in ignored:
        parsed = parse_event_grid(message)
        assert parsed is not None and parsed.file is None and parsed.error is None
    assert (
        "without data.url"
        in parse_event_grid(
            json.dumps({"eventType": "Microsoft.Storage.BlobCreated", "data": {}})
        ).error
    )
    assert (
        parse_event_grid('{"format_version": 1}') is None
        and parse_event_grid("not json at all") is None
    )


@pytest.mark.integration
def test_event_grid_files_are_committed_once_and_bad_ones_dead_lettered(
    local_stack, tmp_path: Path
) -> None:
    config = bookkeeper_config(tmp_path, **azure_queue_settings(local_stack))
    transport = open_transport(config)
    transport.publish(
        make_moniker(config, 1, None, (0, 10))
    )  # a writer's moniker creates the table
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    table = open_catalog(config).load_table("shop.items")
    data = Path(table.location().removeprefix("file://")) / "data" / "external"
    rows = [{"id": 1000 + i, "amount": i, "_kfk_partition": 9, "_kfk_offset": i} for i in range(7)]
    adls = write_file(data / "adls.parquet", SCHEMA, rows[:4])
    blob = write_file(data / "blob.parquet", SCHEMA, rows[4:])
    wrong_size = write_file(data / "wrong-size.parquet", SCHEMA, rows[:1])
    outside = write_file(tmp_path / "elsewhere" / "f.parquet", SCHEMA, rows[:1])

    queue_client = transport.queue
    queue_client.send_message(
        event_grid(adls.path, "CreateFile", 0)
    )  # ADLS: empty file first, ignored
    queue_client.send_message(event_grid(adls.path, "FlushWithClose", adls.size_bytes))
    queue_client.send_message(cloud_event(blob.path, "PutBlob", blob.size_bytes))
    queue_client.send_message(event_grid(wrong_size.path, "PutBlob", wrong_size.size_bytes + 1))
    queue_client.send_message(event_grid(outside.path, "PutBlob", outside.size_bytes))
    report = bookkeeper.run_cycle()
    queue_client.send_message(
        event_grid(adls.path, "FlushWithClose", adls.size_bytes)
    )  # Event Grid delivers at least once
    second = bookkeeper.run_cycle()

    table = open_catalog(config).load_table("shop.items")
    ids = sorted(table.scan().to_arrow().column("id").to_pylist())
    assert ids == sorted(list(range(10)) + [1000 + i for i in range(7)])
    committed = {Path(f.file.file_path).name for f in table.scan().plan_files()}
    assert {"adls.parquet", "blob.parquet"} <= committed and "wrong-size.parquet" not in committed
    assert second.tables[0].snapshot_id is None and len(second.tables[0].duplicates) == 1
    reasons = [reason for _, reason in report.dead_lettered]
    assert (
        len(reasons) == 2 and "no table for file" in reasons[0] and "the event says" in reasons[1]
    )
    dead = [json.loads(m.content)["reason"] for m in transport.dead_letter_queue.receive_messages()]
    assert len(dead) == 2 and any("wrong-size.parquet" in r for r in dead)
    assert queue_client.get_queue_properties().approximate_message_count == 0


def test_event_grid_files_of_an_upsert_table_replace_the_rows_of_their_keys(
    local_stack, tmp_path: Path
) -> None:
    config = bookkeeper_config(tmp_path, mode="upsert", **azure_queue_settings(local_stack))
    transport = open_transport(config)
    transport.publish(UpsertWriter(config).batch([(key, key) for key in range(1, 6)]))
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    location = open_catalog(config).load_table("shop.items").location()
    external = write_file(
        Path(location.removeprefix("file://")) / "data" / "external" / "upserts.parquet",
        SCHEMA,
        [
            {"id": key, "amount": 100 + key, "_kfk_partition": 9, "_kfk_offset": key}
            for key in range(3, 8)
        ],
    )
    transport.queue.send_message(event_grid(external.path, "PutBlob", external.size_bytes))
    report = bookkeeper.run_cycle()
    assert report.tables[0].rows_replaced == 3
    assert pyiceberg_rows(bookkeeper) == {1: 1, 2: 2, 3: 103, 4: 104, 5: 105, 6: 106, 7: 107}


@pytest.mark.integration
def test_event_grid_events_for_icekeeper_s_own_files_commit_nothing(
    local_stack, tmp_path: Path
) -> None:
    """Event Grid announces every blob created under its subscription's filter, a writer's files
    too (seed 003 filters on `/data/`): the moniker brings them, and the event is acknowledged
    without a commit, whether it comes before or after the moniker's."""
    config = bookkeeper_config(tmp_path, **azure_queue_settings(local_stack))
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    first, second = make_moniker(config, 1, None, (0, 10)), make_moniker(config, 2, 1, (10, 20))
    transport.publish(first)
    bookkeeper.run_cycle()
    for moniker in (first, second):  # after its moniker's commit; before it
        entry = moniker.files[0]
        path = entry.path.removeprefix("file://")
        transport.queue.send_message(event_grid(path, "FlushWithClose", entry.size_bytes))
    report = bookkeeper.run_cycle()
    transport.publish(second)
    bookkeeper.run_cycle()
    assert not report.dead_lettered
    offsets = pyiceberg_rows_offsets(config)
    assert offsets == list(range(20))
    assert transport.queue.get_queue_properties().approximate_message_count == 0


def pyiceberg_rows_offsets(config) -> list[int]:
    table = open_catalog(config).load_table("shop.items")
    return sorted(table.scan().to_arrow()["_kfk_offset"].to_pylist())


@pytest.mark.integration
def test_a_file_uploaded_in_blocks_after_an_empty_blob_is_committed(
    local_stack, tmp_path: Path
) -> None:
    """pyarrow's Azure filesystem (so pyarrow, polars and pandas writing `abfss://`) uploads a
    file as an empty blob first (`PutBlob`, 0 bytes), then its blocks (`PutBlockList`): two
    BlobCreated events. The first, read once the file was whole, was quarantined ("N bytes, the
    event says 0") and the second, in the same receive, dropped as its duplicate: the file was
    never committed. The empty blob's event is ignored; the file commits once, from the second."""
    config = bookkeeper_config(tmp_path, **azure_queue_settings(local_stack))
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))  # creates the table
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    table = open_catalog(config).load_table("shop.items")
    data = Path(table.location().removeprefix("file://")) / "data" / "external"
    rows = [{"id": 2000 + i, "amount": i, "_kfk_partition": 9, "_kfk_offset": i} for i in range(5)]
    uploaded = write_file(data / "uploaded-in-blocks.parquet", SCHEMA, rows)
    transport.queue.send_message(event_grid(uploaded.path, "PutBlob", 0))
    transport.queue.send_message(event_grid(uploaded.path, "PutBlockList", uploaded.size_bytes))
    report = bookkeeper.run_cycle()
    assert report.dead_lettered == []
    table = open_catalog(config).load_table("shop.items")
    ids = sorted(table.scan().to_arrow().column("id").to_pylist())
    assert ids == sorted(list(range(10)) + [2000 + i for i in range(5)])
    assert transport.queue.get_queue_properties().approximate_message_count == 0
