"""The bookkeeper's memory follows the history it keeps, not the number of commits it made.

Issue 26: a bookkeeper committing once a second grew by ~6 MB a minute. Each cycle parsed the
monikers' schema anew, and the footer statistics plans cached per schema object kept every one
(with a Parquet footer's schema) until 257 had piled up. With the history held at a fixed length
(`keep_snapshots`, older snapshots expired as it commits), what a commit leaves behind must be
freed by a later one: between two points 100 commits apart, the memory held stays the same.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.transports import open_transport
from tests.support.shop_items import bookkeeper_config, make_moniker

WARM_UP_COMMITS = 40
"""Commits before tracing: the history reaches `keep_snapshots` and every cache its size."""
WINDOW = 100
"""Commits between the two measurements: one whole cycle of merge-append (a table's manifest list
grows to `commit.manifest.min-count-to-merge`, 100, then is merged), so the manifests a table
holds are alike at both ends."""
HELD_PER_COMMIT_BYTES = 2048
"""What each commit of the window may leave held on average: slack for allocator noise, since a
fixed-length history frees a snapshot for each one it adds. Before the fix a commit kept ~12 KB
(a parsed schema and its statistics plan)."""


def test_memory_held_does_not_grow_with_the_number_of_commits(tmp_path: Path) -> None:
    config = bookkeeper_config(
        tmp_path, bookkeeper__keep_snapshots="20", bookkeeper__keep_snapshots_for="0"
    )
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    seq = 0

    def commit(count: int) -> int:
        """Commit `count` monikers, one a cycle; returns the memory traced and still held."""
        nonlocal seq
        for _ in range(count):
            seq += 1
            transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 5, seq * 5)))
            assert bookkeeper.run_cycle().committed_monikers == 1
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    try:
        commit(WARM_UP_COMMITS)
        tracemalloc.start()
        try:
            first = commit(WINDOW)
            before = tracemalloc.take_snapshot()
            second = commit(WINDOW)
            grown = tracemalloc.take_snapshot().compare_to(before, "lineno")[:5]
            third = commit(WINDOW)
        finally:
            tracemalloc.stop()
        assert len(bookkeeper.catalog.load_table("shop.items").snapshots()) == 20
        # The smaller of two windows: a leak grows in both, while a table the interpreter grows
        # once (the interned strings' dict, which pathlib fills, reached 3.7 MB in one window of
        # a full test run) lands in one only.
        per_commit = min(second - first, third - second) / WINDOW
        assert per_commit <= HELD_PER_COMMIT_BYTES, (
            f"{per_commit:.0f} bytes more held per commit; grown most: "
            + "; ".join(str(stat) for stat in grown)
        )
    finally:
        bookkeeper.committer.close(save_key_indexes=False)


def test_commits_plan_the_footer_statistics_once_per_schema(tmp_path, monkeypatch) -> None:
    """The statistics plan depends on the schema and the metrics properties only: the committed
    state, a table property new with every commit, must not make each commit plan anew (~0.7 ms a
    commit, and a cached plan pushed out per commit)."""
    from icekeeper.bookkeeper import datafiles

    plans = []
    compute = datafiles.compute_statistics_plan
    monkeypatch.setattr(
        datafiles,
        "compute_statistics_plan",
        lambda schema, properties: plans.append(properties) or compute(schema, properties),
    )
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    try:
        for seq in range(1, 6):
            transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 5, seq * 5)))
            assert bookkeeper.run_cycle().committed_monikers == 1
    finally:
        bookkeeper.committer.close(save_key_indexes=False)
    assert len(plans) <= 1, f"{len(plans)} statistics plans for one schema over 5 commits"
