"""A deleted and recreated topic with `sources[].on_topic_reset: restart`: the tables start over
from the new topic's first offset, the moniker says so, and the bookkeeper replaces the
partition's committed offset, once, whatever restarts in between.

Against the stack's real Kafka: the topic is deleted and created again through the admin API.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.bookkeeper.exactly_once import next_committed_offset, overlapping_offsets
from icekeeper.common.committed_state import committed_state
from icekeeper.common.moniker import Moniker, OffsetRange, moniker_id
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.job import WriterJob
from icekeeper.writers.offsets import PartitionBounds, pending_restarts, plan_batch
from tests.support.pipeline import commit_all, pipeline_config, table_rows
from tests.support.recreated_topic import TABLE, produce, recreate, topic_config


@pytest.mark.integration
@pytest.mark.spark
def test_a_recreated_topic_starts_the_table_over_once_when_configured(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = topic_config(
        tmp_path, unique_topic, {"ICEKEEPER__SOURCES__0__ON_TOPIC_RESET": "restart"}
    )
    produce(config, unique_topic, seed=61, events=300)
    WriterJob(config, spark=spark).run(until_idle=True)
    commit_all(config)
    recreate(config, unique_topic)
    produce(config, unique_topic, seed=62, events=40)

    reports = WriterJob(config, spark=spark).run(until_idle=True, max_batches=3)
    assert sum(r.rows_written for r in reports) == 40
    job = WriterJob(config, spark=spark)
    [moniker] = job.transport.pending()
    assert moniker.offsets == [
        OffsetRange(
            topic=unique_topic, partition=0, from_offset=0, until_offset=40, topic_reset=True
        )
    ]
    # A writer started again before the bookkeeper commits does not start over a second time.
    assert job.run(until_idle=True, max_batches=2) == [] and len(job.transport.pending()) == 1

    bookkeeper = commit_all(config)
    table = bookkeeper.catalog.load_table(TABLE)
    assert committed_state(table).offsets == {(unique_topic, 0): 40}
    offsets = sorted(row["_kfk_offset"] for row in table_rows(bookkeeper, TABLE))
    assert offsets == sorted([*range(300), *range(40)])

    # After the commit the new topic is read on from where the restart got to, and only once.
    produce(config, unique_topic, seed=63, events=10)
    reports = WriterJob(config, spark=spark).run(until_idle=True, max_batches=3)
    assert sum(r.rows_written for r in reports) == 10
    bookkeeper = commit_all(config)
    table = bookkeeper.catalog.load_table(TABLE)
    assert committed_state(table).offsets == {(unique_topic, 0): 50}
    assert len(table_rows(bookkeeper, TABLE)) == 350


def test_the_plan_restarts_only_tables_beyond_the_end_when_configured() -> None:
    bounds = {("t", 0): PartitionBounds(earliest=0, latest=40)}
    positions = {"a": {("t", 0): 300}, "b": {("t", 0): 20}}
    stopped = plan_batch(bounds, positions)
    assert stopped.behind_next == {("t", 0): (300, 40)} and stopped.restarted == {}
    restarted = plan_batch(bounds, positions, on_topic_reset="restart")
    assert restarted.behind_next == {}
    assert restarted.restarted == {"a": {("t", 0)}}
    assert restarted.read_ranges == {("t", 0): (0, 40)}
    assert restarted.table_range("a", ("t", 0)) == (0, 40)
    assert restarted.table_range("b", ("t", 0)) == (20, 40)


def _moniker(seq: int, *ranges: OffsetRange) -> Moniker:
    return Moniker(
        id=moniker_id("w", TABLE, list(ranges)),
        writer_id="w",
        seq=seq,
        table=TABLE,
        schema={"type": "struct", "fields": [], "schema-id": 0},
        offsets=list(ranges),
        records=0,
    )


def test_pending_restarts_follow_the_newest_restart_of_each_partition() -> None:
    old = OffsetRange(topic="t", partition=0, from_offset=200, until_offset=300)
    restart = OffsetRange(topic="t", partition=0, from_offset=0, until_offset=40, topic_reset=True)
    after = OffsetRange(topic="t", partition=0, from_offset=40, until_offset=55)
    other = OffsetRange(topic="t", partition=1, from_offset=0, until_offset=9)
    assert pending_restarts([_moniker(3, after), _moniker(1, old), _moniker(2, restart)]) == {
        ("t", 0): 55
    }
    assert pending_restarts([_moniker(1, old, other)]) == {}


def test_the_bookkeeper_takes_a_restart_below_the_committed_offset_and_replaces_it() -> None:
    committed = {("t", 0): 300}
    restart = OffsetRange(topic="t", partition=0, from_offset=0, until_offset=40, topic_reset=True)
    plain = OffsetRange(topic="t", partition=0, from_offset=0, until_offset=40)
    assert overlapping_offsets(_moniker(2, restart), committed) is None
    assert "would be added twice" in (overlapping_offsets(_moniker(2, plain), committed) or "")
    assert next_committed_offset(committed, restart) == 40
    assert next_committed_offset(committed, plain) == 300


@pytest.mark.integration
@pytest.mark.spark
def test_a_table_with_no_row_in_the_restarted_partition_takes_the_restart_once(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    tables = (
        f"[{{identifier: shop.orders, topics: [{unique_topic}], source_table: orders, "
        "mode: changelog}, "
        f"{{identifier: shop.items, topics: [{unique_topic}], source_table: items, "
        "mode: changelog}]"
    )
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {"ICEKEEPER__TABLES": tables, "ICEKEEPER__SOURCES__0__ON_TOPIC_RESET": "restart"},
    )

    def produce(seed: int, table: str, events: int) -> None:
        produce_synthetic(
            config,
            SyntheticSpec(seed=seed, keys=20, events=events, schema_changes=0, table=table),
            topic=unique_topic,
            partitions=1,
            progress=lambda m: None,
        )

    produce(71, "orders", 30)
    produce(72, "items", 20)
    WriterJob(config, spark=spark).run(until_idle=True)
    commit_all(config)
    recreate(config, unique_topic)
    produce(73, "orders", 5)  # nothing for shop.items in the new topic yet

    reports = WriterJob(config, spark=spark).run(until_idle=True, max_batches=3)
    assert [r.rows_written for r in reports] == [5]
    bookkeeper = commit_all(config)
    for identifier in ("shop.orders", "shop.items"):
        table = bookkeeper.catalog.load_table(identifier)
        assert committed_state(table).offsets == {(unique_topic, 0): 5}, identifier

    produce(74, "items", 4)
    reports = WriterJob(config, spark=spark).run(until_idle=True, max_batches=3)
    assert sum(r.rows_written for r in reports) == 4
    bookkeeper = commit_all(config)
    assert len(table_rows(bookkeeper, "shop.orders")) == 35
    assert len(table_rows(bookkeeper, "shop.items")) == 24
