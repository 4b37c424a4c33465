"""The bookkeeper keeps history by time (`keep_snapshots_for`, an hour by default) and at least
`keep_snapshots` snapshots, expiring older ones as it commits: the history a lagging streaming
reader needs, and no more."""

from __future__ import annotations

import time
from pathlib import Path

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.transports import open_transport
from tests.support.shop_items import bookkeeper_config, make_moniker


def test_snapshots_younger_than_an_hour_stay_and_older_ones_go_down_to_the_minimum(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(tmp_path)
    assert (config.bookkeeper.keep_snapshots, config.bookkeeper.keep_snapshots_for) == (20, 3600)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)

    def commit(seq: int) -> None:
        transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 5, seq * 5)))
        assert bookkeeper.run_cycle().committed_monikers == 1

    for seq in range(1, 41):
        commit(seq)
    table = bookkeeper.catalog.load_table("shop.items")
    assert len(table.snapshots()) == 40  # all younger than an hour, though beyond 20
    first = table.snapshots()[0]
    bookkeeper.committer.commit_path.now_ms = lambda: (
        int(time.time() * 1000) + 3_600_000 - 30_000
    )  # 59.5 minutes on
    commit(41)
    assert len(bookkeeper.catalog.load_table("shop.items").snapshots()) == 41
    # Two hours on.
    bookkeeper.committer.commit_path.now_ms = lambda: int(time.time() * 1000) + 2 * 3_600_000
    commit(42)
    table = bookkeeper.catalog.load_table("shop.items")
    assert len(table.snapshots()) == 20 and table.snapshot_by_id(first.snapshot_id) is None
    assert sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist()) == list(range(42 * 5))
