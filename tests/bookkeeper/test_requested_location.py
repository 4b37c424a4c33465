"""On Nessie a table's location gets `_<uuid>` appended, so the location writers used before the
table existed is recorded in `icekeeper.requested-location`, and monikers under it are
accepted. Recorded by a second request after the create, a bookkeeper that died between the two
(or lost the create's answer) left a table without it, and `create_table` never ran again: the
monikers written before the table existed were quarantined for good (found by a review)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.table import Table

from icekeeper.bookkeeper.moniker_append import create_table
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import open_catalog
from icekeeper.common.transports import open_transport
from tests.support.catalog_layouts import SCHEMA, S3Writer, layout_config, table_of

pytestmark = pytest.mark.integration


def test_a_bookkeeper_dying_right_after_creating_the_table_loses_no_moniker(
    tmp_path: Path, nessie_catalog, monkeypatch
) -> None:
    config = layout_config(tmp_path, nessie_catalog)
    identifier = table_of(config)
    transport, writer = open_transport(config), S3Writer(config)
    catalog = open_catalog(config)  # configures the storage door
    first = writer.batch([(1, 1), (2, 2)])  # written before the table exists
    second = writer.batch([(3, 3)])

    def dies(self: Table):
        raise RuntimeError("the bookkeeper died right after creating the table")

    with monkeypatch.context() as patched:
        patched.setattr(Table, "transaction", dies)
        try:
            table = create_table(catalog, config, identifier, first, SCHEMA)
        except RuntimeError:
            table = catalog.load_table(identifier)
    assert table.location().rstrip("/") != config.tables[0].location.rstrip("/")  # Nessie's
    transport.publish(first)
    transport.publish(second)
    report = Bookkeeper(config).run_cycle()  # the next bookkeeper
    quarantined = [why for t in report.tables for _, why in t.quarantined]
    assert quarantined == [] and report.committed_monikers == 2
