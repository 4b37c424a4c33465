"""Kafka behind what a table read: a deleted and recreated topic stops the writer with a clear
error; records deleted by retention before they were read are counted in the batch report.

Against the stack's real Kafka: the topic is deleted and created again through the admin API, and
retention is played by the delete-records API, which moves a partition's first offset as the
log cleaner does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from icekeeper.writers.job import WriterJob
from icekeeper.writers.offsets import PartitionBounds, TopicReset, plan_batch
from tests.support.pipeline import commit_all, table_rows
from tests.support.recreated_topic import TABLE, produce, recreate, topic_config


@pytest.mark.integration
@pytest.mark.spark
def test_records_lost_to_retention_are_counted_in_the_batch_report(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = topic_config(tmp_path, unique_topic)
    produce(config, unique_topic, seed=51, events=300)
    assert sum(r.rows_written for r in WriterJob(config, spark=spark).run(until_idle=True)) == 300
    produce(config, unique_topic, seed=52, events=300)
    # Retention deletes offsets 300-449 before the writer comes back for them.
    admin = AdminClient({"bootstrap.servers": config.sources[0].bootstrap_servers})
    for future in admin.delete_records([TopicPartition(unique_topic, 0, 450)]).values():
        future.result(timeout=30)

    reports = WriterJob(config, spark=spark).run(until_idle=True)
    assert sum(r.lost_to_retention for r in reports) == 150
    assert sum(r.rows_written for r in reports) == 150
    offsets = sorted(row["_kfk_offset"] for row in table_rows(commit_all(config), TABLE))
    assert offsets == [*range(300), *range(450, 600)]


@pytest.mark.integration
@pytest.mark.spark
def test_a_recreated_topic_stops_the_writer_with_a_clear_error(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = topic_config(tmp_path, unique_topic)
    produce(config, unique_topic, seed=53, events=300)
    WriterJob(config, spark=spark).run(until_idle=True)
    commit_all(config)
    recreate(config, unique_topic)
    produce(config, unique_topic, seed=54, events=40)

    job = WriterJob(config, spark=spark)
    with pytest.raises(
        TopicReset,
        match=rf"{unique_topic}:0 \(next offset 300, Kafka's end 40\).*deleted and recreated",
    ):
        job.run(until_idle=True)
    # Stopped before reading: the new topic's records are neither skipped nor written.
    assert job.transport.pending() == []
    assert len(table_rows(commit_all(config), TABLE)) == 300


def test_the_plan_names_partitions_behind_the_next_offset_and_counts_records_lost() -> None:
    bounds = {
        ("t", 0): PartitionBounds(earliest=0, latest=40),
        ("t", 1): PartitionBounds(earliest=450, latest=600),
        ("t", 2): PartitionBounds(earliest=0, latest=10),
    }
    plan = plan_batch(
        bounds, {"a": {("t", 0): 300, ("t", 1): 300, ("t", 2): 5}, "b": {("t", 0): 200}}
    )
    assert plan.behind_next == {("t", 0): (300, 40)}
    assert plan.lost_to_retention == {("t", 1): 150}
    assert plan.read_ranges == {("t", 1): (450, 600), ("t", 2): (0, 10)}  # table b never read t:2
