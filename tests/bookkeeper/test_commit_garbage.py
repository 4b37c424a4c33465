"""A commit leaves its table and metadata to reference counting, not to the cyclic collector.

Issue 26's soak: with an hour of history, the bookkeeper held a few hundred old metadata
versions (each with lists as long as the history) and every snapshot expired since the last
full pass of Python's cyclic garbage collector, which comes every few hundred commits: the
pyiceberg transaction and its snapshot producer referred to each other, and every FileIO to
itself. Freed by reference counting, each commit's objects go as soon as the next commit
replaces them."""

from __future__ import annotations

import collections
import gc
from pathlib import Path

from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadataCommonFields
from pyiceberg.types import NestedField

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.transports import open_transport
from tests.support.shop_items import SCHEMA, bookkeeper_config, make_moniker

COMMITS = 12
RENAMED = Schema(
    *(
        NestedField(f.field_id, "total", f.field_type, required=False) if f.name == "amount" else f
        for f in SCHEMA.fields
    ),
    identifier_field_ids=[1],
)
"""The table's schema with field 2 (`amount`) under another name: a change the bookkeeper
refuses ("field id 2 is 'amount'")."""


def test_commits_and_expiry_leave_no_table_metadata_for_the_cyclic_collector(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(
        tmp_path, bookkeeper__keep_snapshots="2", bookkeeper__keep_snapshots_for="0s"
    )
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    try:
        transport.publish(make_moniker(config, 1, None, (0, 10)))
        assert bookkeeper.run_cycle().committed_monikers == 1
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            # And a moniker the table cannot take (its schema renames a field): quarantined
            # with its reason, which the cycle must not keep with the frame that read it.
            transport.publish(
                make_moniker(
                    config, 1, None, (0, 10), writer_id="renamed", partition=1, schema=RENAMED
                )
            )
            quarantined = []
            for seq in range(2, COMMITS + 2):
                transport.publish(make_moniker(config, seq, seq - 1, ((seq - 1) * 10, seq * 10)))
                report = bookkeeper.run_cycle()
                assert report.committed_monikers == 1
                quarantined += [reason for _, reason in report.tables[0].quarantined]
            gc.collect()
            left = collections.Counter(
                kind.__name__
                for item in gc.garbage
                for kind in (Table, Transaction, TableMetadataCommonFields, FileIO)
                if isinstance(item, kind)
            )
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        table = bookkeeper.catalog.load_table("shop.items")
        assert len(table.metadata.snapshots) <= 3  # snapshots expired as the commits went
        assert quarantined and "amount" in quarantined[0]
        assert left == {}, f"left to the cyclic collector by {COMMITS} commits: {dict(left)}"
    finally:
        bookkeeper.committer.close(save_key_indexes=False)
