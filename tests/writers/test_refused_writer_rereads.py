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

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.committed_state import committed_state
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import commit_all, pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def table_positions(bookkeeper: Bookkeeper) -> Counter:
    rows = bookkeeper.catalog.load_table("shop.orders").scan().to_arrow()
    return Counter(
        zip(rows.column("_kfk_partition").to_pylist(), rows.column("_kfk_offset").to_pylist())
    )


@pytest.mark.parametrize(
    ("restarted", "batches_before"),
    [(False, 1), (True, 1), (False, 2)],
    ids=["same-process", "restarted", "two-batches-refused"],
)
def test_a_refused_writer_reads_its_refused_offsets_again(
    local_stack, spark, tmp_path: Path, unique_topic: str, restarted: bool, batches_before: int
) -> None:
    """`batches_before`: batches the new writer publishes before the bookkeeper refuses the first
    (the second is planned on it, and its checkpoint then stands past both; its re-reading, capped
    at 120 records a batch, takes more than one batch)."""
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
        SyntheticSpec(seed=26, keys=50, events=600, schema_changes=0),
        topic=unique_topic,
        partitions=1,
        progress=lambda m: None,
    )

    old_writer = WriterJob(old, spark=spark)
    old_writer.run(max_batches=1)  # 0..60
    bookkeeper = commit_all(old)
    old_writer.run(max_batches=1)  # 60..120, pending
    new_writer = WriterJob(new, spark=spark)
    new_writer.run(max_batches=batches_before)  # 60..180 (and 180..300): pending too

    report = bookkeeper.run_cycle()  # the old writer's comes first, the new one's is refused
    assert report.committed_monikers == 1 and len(report.refused) == batches_before
    state = committed_state(bookkeeper.catalog.load_table("shop.orders"))
    assert state.offsets == {(unique_topic, 0): 120}
    assert "writer-after-reassignment" in state.refusals

    if restarted:
        new_writer = WriterJob(new, spark=spark)  # fresh memory; its checkpoint stands at 180
    new_writer.run(until_idle=True)
    while bookkeeper.run_cycle().committed_monikers:
        pass

    positions = table_positions(bookkeeper)
    assert sorted(positions) == [(0, offset) for offset in range(600)]
    assert set(positions.values()) == {1}
    final = committed_state(bookkeeper.catalog.load_table("shop.orders"))
    assert final.offsets == {(unique_topic, 0): 600}
    assert final.refusals == {}  # settled: the writer's chain moved past it
    assert bookkeeper.transport.pending() == []


def test_a_restarted_writer_continues_the_seq_chain_of_its_templated_tables(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """Tables a `table_template` names are not in the config: a restarted writer must still find
    their committed seqs (and any refusal), or its next moniker waits forever on a `prev_seq` it
    does not know, or reuses a committed seq and is dropped as a duplicate."""
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            # The configured table claims another topic: every record goes to the template's.
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.unused",
            "ICEKEEPER__TABLES__0__TOPICS": "[another.topic]",
            "ICEKEEPER__SOURCES__0__TABLE_TEMPLATE": "cdc.{db}_{table}",
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "100",
        },
    )
    produce_synthetic(
        config,
        SyntheticSpec(seed=27, keys=50, events=200, schema_changes=0),
        topic=unique_topic,
        partitions=1,
        progress=lambda m: None,
    )
    WriterJob(config, spark=spark).run(max_batches=1)
    bookkeeper = commit_all(config)
    [identifier] = [".".join(t) for t in bookkeeper.catalog.list_tables("cdc")]

    WriterJob(config, spark=spark).run(until_idle=True)  # restarted: fresh memory
    while bookkeeper.run_cycle().committed_monikers:
        pass
    rows = bookkeeper.catalog.load_table(identifier).scan().to_arrow()
    assert sorted(rows.column("_kfk_offset").to_pylist()) == list(range(200))
    assert bookkeeper.transport.pending() == []
