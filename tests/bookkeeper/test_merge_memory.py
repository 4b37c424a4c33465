"""A manifest merge holds one entry at a time, not every live data file of the table.

Issue 26: merge-append rewrites the table's manifests into one every
`commit.manifest.min-count-to-merge` commits, and pyiceberg read each merged manifest as a list
of all its entries (each data file with its column statistics). That commit's memory peak grew
with the live data files, and each higher peak left Python's allocator holding arenas it never
gave back: the bookkeeper's resident memory grew with its commits although what it held did not
(`python -m icekeeper.bench.bookkeeper_memory`: 6 KB a commit). Now the merge reads entries as a
stream (`common.internals.manifest_entries`).
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.transports import open_transport
from tests.support.shop_items import bookkeeper_config, make_moniker

LIVE_FILES = 1500
"""Data files the first commit adds: the merged manifest lists them all."""
MERGE_AFTER = 4
"""The table's `commit.manifest.min-count-to-merge`: the merge comes within a few commits."""
PEAK_BOUND_BYTES = 1_500_000
"""The most a merge commit may allocate above what it started with. Streamed, the peak does not
depend on the live files (0.9 MB measured, 0.4 MB for a commit without a merge); as a list, the
1,500 entries took 5.2 MB."""


def test_a_manifest_merge_does_not_hold_every_live_file_at_once(tmp_path: Path) -> None:
    config = bookkeeper_config(
        tmp_path,
        tables=(
            "[{identifier: shop.items, topics: [items], primary_key: [id], mode: changelog, "
            f"properties: {{commit.manifest.min-count-to-merge: '{MERGE_AFTER}'}}}}]"
        ),
        bookkeeper__max_files_per_commit=str(LIVE_FILES),
    )
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    try:
        transport.publish(make_moniker(config, 1, None, (0, LIVE_FILES), files=LIVE_FILES))
        assert bookkeeper.run_cycle().committed_monikers == 1
        peaks = []
        for seq in range(2, MERGE_AFTER + 3):
            transport.publish(
                make_moniker(config, seq, seq - 1, (LIVE_FILES + seq, LIVE_FILES + seq + 1))
            )
            gc.collect()
            tracemalloc.start()
            try:
                assert bookkeeper.run_cycle().committed_monikers == 1
                current, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            peaks.append(peak)
        table = bookkeeper.catalog.load_table("shop.items")
        manifests = table.current_snapshot().manifests(table.io)
        # The merge happened: the first commit's manifest was rewritten with the later ones.
        assert len(manifests) < MERGE_AFTER, [m.manifest_path for m in manifests]
        assert max(peaks) <= PEAK_BOUND_BYTES, f"commit peaks (bytes): {peaks}"
        # And the merged manifests still list every live file (a stream read twice, or cut
        # short, would drop files from the table and still pass the memory bound).
        live = [
            entry.data_file.file_path
            for manifest in manifests
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        ]
        assert len(live) == len(set(live)) == LIVE_FILES + MERGE_AFTER + 1
    finally:
        bookkeeper.committer.close(save_key_indexes=False)
