"""A writer whose moniker the table refused reads the refused offsets again (issue 26, item 2).

A partition changes writer (a new `writer_id`, `instance_count` changed) while the old writer's
moniker for it is pending. The new writer reads from the committed offset, past what the old one
covers; the old one commits first and the new one is refused. Its progress and checkpoint stood
past the refused range, so the records beyond the old writer's moniker were never read again:
lost. Here the refused writer's own next batch (and, restarted, its first) must bring them.

Checked by position: every record of the topic is in the table exactly once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bookkeeper.service import Bookkeeper
from common.committed_state import committed_state
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from tests.support.pipeline import commit_all, pipeline_config
from writers.job import WriterJob

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def table_positions(bookkeeper: Bookkeeper) -> Counter:
    rows = bookkeeper.catalog.load_table("shop.orders").scan().to_arrow()
    return Counter(
        zip(rows.column("_kfk_partition").to_pylist(), rows.column("_kfk_offset").to_pylist())
    )


@pytest.mark.parametrize("restarted", [False, True], ids=["same-process", "restarted"])
def test_a_refused_writer_reads_its_refused_offsets_again(
    local_stack, spark, tmp_path: Path, unique_topic: str, restarted: bool
) -> None:
    base = {
        "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
        "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
        "ICEKEEPER__TABLES__0__MODE": "changelog",
    }
    old = pipeline_config(
        tmp_path,
        unique_topic,
        {**base, "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "60"},
    )
    # The partition's new writer: same tables and catalog, another writer id, larger batches.
    new_settings = {
        **base,
        "ICEKEEPER__CATALOG__NAME": old.catalog.name,
        "ICEKEEPER__WRITER__WRITER_ID": "writer-after-reassignment",
        "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "120",
    }
    new = pipeline_config(tmp_path, unique_topic, new_settings)
    produce_synthetic(
        old,
        SyntheticSpec(seed=26, keys=50, events=300, schema_changes=0),
        topic=unique_topic,
        partitions=1,
        progress=lambda m: None,
    )

    old_writer = WriterJob(old, spark=spark)
    old_writer.run(max_batches=1)  # 0..60
    bookkeeper = commit_all(old)
    old_writer.run(max_batches=1)  # 60..120, pending
    new_writer = WriterJob(new, spark=spark)
    new_writer.run(max_batches=1)  # 60..180 from the committed offset: pending too

    report = bookkeeper.run_cycle()  # the old writer's comes first, the new one's is refused
    assert report.committed_monikers == 1
    state = committed_state(bookkeeper.catalog.load_table("shop.orders"))
    assert state.offsets == {(unique_topic, 0): 120}
    assert "writer-after-reassignment" in state.refusals

    if restarted:
        new_writer = WriterJob(new, spark=spark)  # fresh memory; its checkpoint stands at 180
    new_writer.run(until_idle=True)
    bookkeeper.run_cycle()
    bookkeeper.run_cycle()

    positions = table_positions(bookkeeper)
    assert sorted(positions) == [(0, offset) for offset in range(300)]
    assert set(positions.values()) == {1}
    final = committed_state(bookkeeper.catalog.load_table("shop.orders"))
    assert final.offsets == {(unique_topic, 0): 300}
    assert final.refusals == {}  # settled: the writer's chain moved past it
    assert bookkeeper.transport.pending() == []
