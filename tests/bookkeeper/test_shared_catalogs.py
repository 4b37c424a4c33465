"""The bookkeeper on the shared catalogs users run: Hive Metastore 3.1.3 and a SQL catalog in
PostgreSQL, the warehouse on the stack's S3 server (issue 28, item 3).

Each commit goes through the catalog's own compare-and-swap (a Hive commit locks the table in
the metastore, reads its metadata location, and alters the table; a SQL commit updates the
table's row where the metadata location is still the one read), with the bookkeeper's lean
metadata path (bookkeeper/table_metadata.py) in place of pyiceberg's: the metadata files it
writes must be pyiceberg's JSON, and a commit another client made meanwhile must be kept.
"""

from __future__ import annotations

import json
import random

import pytest
from pyiceberg.serializers import FromInputFile, ToOutputFile

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import open_catalog
from icekeeper.common.committed_state import committed_state
from icekeeper.common.storage import open_filesystem
from icekeeper.common.transports import open_transport
from tests.support.hms_pg_layouts import (
    LAYOUTS,
    CatalogLayout,
    S3UpsertWriter,
    catalog_layout_for,
)
from tests.support.shop_items import (
    applied,
    duckdb_rows,
    make_moniker,
    pyiceberg_rows,
    whole_topic_moniker,
)

pytestmark = pytest.mark.integration


@pytest.fixture(params=LAYOUTS)
def catalog_layout(request) -> CatalogLayout:
    return catalog_layout_for(request.getfixturevalue(request.param))


def metadata_json(location: str) -> dict:
    filesystem, path = open_filesystem(location)
    with filesystem.open_input_stream(path) as source:
        return json.loads(source.read())


def assert_pyiceberg_would_write_the_same(table, scratch: str) -> None:
    """The table's newest metadata file is the JSON pyiceberg's own writer makes of it."""
    theirs = f"{scratch}/pyiceberg-{table.metadata.last_sequence_number}.metadata.json"
    ToOutputFile.table_metadata(table.metadata, table.io.new_output(theirs))
    assert metadata_json(table.metadata_location) == metadata_json(theirs)


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The metadata files parsed from now on (by any catalog object of this process)."""
    parsed: list[str] = []
    parse = FromInputFile.table_metadata

    def parsing(input_file, encoding: str = "utf-8"):
        parsed.append(input_file.location)
        return parse(input_file, encoding)

    monkeypatch.setattr(FromInputFile, "table_metadata", staticmethod(parsing))
    return parsed


def test_changelog_monikers_are_committed_once_with_pyiceberg_s_metadata(
    catalog_layout: CatalogLayout, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = catalog_layout.bookkeeper_config(
        tmp_path, bookkeeper__keep_snapshots="3", bookkeeper__keep_snapshots_for="0"
    )
    transport, bookkeeper = open_transport(config), Bookkeeper(config)
    monikers = [
        make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 5, seq * 5)) for seq in range(1, 7)
    ]
    transport.publish(monikers[0])
    assert bookkeeper.run_cycle().committed_monikers == 1
    parsed = count_parses(monkeypatch)
    for moniker in monikers[1:]:
        transport.publish(moniker)
        report = bookkeeper.run_cycle()
        assert report.committed_monikers == 1, report
    # The metadata files it wrote itself are not parsed again, by its loads or its commits.
    assert parsed == [], parsed
    # A second delivery of a committed moniker (a writer that published it again) adds nothing,
    # and neither does a bookkeeper that starts afresh and finds it.
    transport.publish(monikers[2])
    assert bookkeeper.run_cycle().committed_monikers == 0
    transport.publish(monikers[4])
    assert Bookkeeper(config).run_cycle().committed_monikers == 0
    assert transport.pending() == []

    table = open_catalog(config).load_table("shop.items")  # pyiceberg's own path
    assert len(table.snapshots()) == 3  # expired along the way: keep 3, no age
    assert sorted(table.scan().to_arrow()["_kfk_offset"].to_pylist()) == list(range(30))
    assert_pyiceberg_would_write_the_same(table, catalog_layout.warehouse)
    # The catalog holds what the bookkeeper wrote: the metadata file it read back is its own.
    parsed = FromInputFile.table_metadata(table.io.new_input(table.metadata_location))
    assert parsed.model_dump() == table.metadata.model_dump()

    # Another client commits meanwhile (a tag); the bookkeeper's next commit keeps it.
    other = open_catalog(config).load_table("shop.items")
    other.manage_snapshots().create_tag(other.current_snapshot().snapshot_id, "elsewhere").commit()
    transport.publish(make_moniker(config, 7, 6, (30, 35)))
    assert bookkeeper.run_cycle().committed_monikers == 1
    table = open_catalog(config).load_table("shop.items")
    assert "elsewhere" in table.metadata.refs
    assert sorted(table.scan().to_arrow()["_kfk_offset"].to_pylist()) == list(range(35))
    assert_pyiceberg_would_write_the_same(table, catalog_layout.warehouse)


def churn(rng: random.Random, keys: int) -> list[tuple[int, int | None]]:
    """Most keys updated, a few deleted: files soon mostly deleted, so the bookkeeper purges."""
    changes: list[tuple[int, int | None]] = [
        (key, rng.randrange(10**6)) for key in rng.sample(range(keys), int(0.8 * keys))
    ]
    changes += [(key, None) for key in rng.sample(range(keys), keys // 20)]
    rng.shuffle(changes)
    return changes


def test_the_committed_state_of_a_64_partition_topic_is_kept_in_the_catalog(
    catalog_layout: CatalogLayout, tmp_path
) -> None:
    """The state is a table property (3.3 KB for 64 partitions); a Hive Metastore keeps every
    table property as a table parameter too: it takes it, and a restarted bookkeeper reads the
    state back exactly."""
    config = catalog_layout.bookkeeper_config(tmp_path)
    transport = open_transport(config)
    for seq in (1, 2):
        transport.publish(whole_topic_moniker(config, seq, seq - 1 or None, 64))
        assert Bookkeeper(config).run_cycle().committed_monikers == 1
    state = committed_state(open_catalog(config).load_table("shop.items"))
    assert state.offsets == {("items", p): 1_000_000_020 for p in range(64)}
    assert state.writer_seqs == {"w1": 2}


def test_an_upsert_table_keeps_one_row_per_key_through_its_purges(
    catalog_layout: CatalogLayout, tmp_path
) -> None:
    config = catalog_layout.bookkeeper_config(tmp_path, mode="upsert")
    transport, writer = open_transport(config), S3UpsertWriter(config)
    bookkeeper = Bookkeeper(config)
    rng, reference = random.Random(28), {}
    for changes in [[(k, k) for k in range(200)]] + [churn(rng, 200) for _ in range(4)]:
        transport.publish(writer.batch(changes))
        report = bookkeeper.run_cycle()
        assert report.tables[0].committed and not report.tables[0].quarantined
        applied(reference, changes)
        assert pyiceberg_rows(bookkeeper) == reference
    assert duckdb_rows(bookkeeper) == reference
    table = open_catalog(config).load_table("shop.items")
    operations = [snapshot.summary.operation.value for snapshot in table.snapshots()]
    assert "replace" in operations, operations  # a purge committed through the catalog
    assert pyiceberg_rows(Bookkeeper(config)) == reference
