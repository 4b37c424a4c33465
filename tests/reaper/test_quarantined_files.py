"""A quarantined moniker's files are never orphans (issue 14, item 1): its records are nowhere
else until it is replayed, so orphan removal spares them however old they are."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from icekeeper.bench.reaper import age_files
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import open_catalog
from icekeeper.common.committed_state import committed_state
from icekeeper.common.transports import open_transport
from icekeeper.reaper.service import Reaper
from tests.support.pipeline import register_catalog
from tests.support.shop_items import make_moniker, reaper_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_a_quarantined_monikers_files_survive_the_reaper_and_its_replay_commits_them(
    spark, tmp_path: Path
) -> None:
    config = reaper_config(tmp_path, bookkeeper__missing_file_timeout="0.5s")
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    bookkeeper.run_cycle()  # creates the table
    register_catalog(spark, config)
    lost = make_moniker(config, 2, 1, (10, 40), files=3)
    transport.publish(lost)
    away = Path(lost.files[1].path.removeprefix("file://"))
    away.rename(away.with_name("moved-away"))
    bookkeeper.run_cycle()
    time.sleep(0.6)  # the point: the file stays missing past the 0.5 s timeout
    # Missing past the timeout: quarantined, the writer's chain goes on.
    [(_, reason)] = bookkeeper.run_cycle().dead_lettered
    assert "missing for" in reason
    [item] = transport.quarantined()
    assert item.moniker == lost and item.reason == reason
    present = [
        Path(entry.path.removeprefix("file://"))
        for entry in lost.files
        if Path(entry.path.removeprefix("file://")).exists()
    ]
    age_files([f"file://{path}" for path in present], 3600)

    report = Reaper(config, spark=spark).run_pass()
    assert not report.tables[0].errors
    assert all(path.exists() for path in present)  # spared, however old
    assert report.tables[0].orphans_spared == len(present)

    away.with_name("moved-away").rename(away)  # the operator found the file
    transport.replay(item)
    assert transport.quarantined() == []
    assert bookkeeper.run_cycle().committed_monikers == 1
    table = open_catalog(config).load_table("shop.items")
    assert sorted(
        table.scan(selected_fields=("_kfk_offset",)).to_arrow().column(0).to_pylist()
    ) == list(range(40))
    assert committed_state(table).quarantined_records == 0
