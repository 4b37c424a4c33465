"""A small batch on `writer.engine: arrow` runs its tasks in the writer's own process, with no
Spark job (a job's fixed cost is most of a small batch's time: issue 15's freshness), and writes
the table a Spark job writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient

from icekeeper.samples.debezium import BinlogPosition, Column, TableShape, envelope
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic, produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import commit_all, table_rows
from tests.support.recreated_topic import TABLE, topic_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _spark_jobs(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


def test_a_small_batch_runs_in_the_writer_and_writes_what_a_spark_job_writes(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    configs = {
        limit: topic_config(
            tmp_path / f"limit-{limit}",
            unique_topic,
            {
                "ICEKEEPER__WRITER__ENGINE": "arrow",
                "ICEKEEPER__WRITER__DRIVER_BATCH_RECORDS": str(limit),
            },
        )
        for limit in (20_000, 0)
    }
    produce_synthetic(
        configs[20_000],
        SyntheticSpec(seed=5, keys=40, events=600, schema_changes=0),
        topic=unique_topic,
        partitions=3,
        progress=lambda m: None,
    )
    rows = {}
    jobs = {}
    for limit, config in configs.items():
        before = _spark_jobs(spark)
        reports = WriterJob(config, spark=spark).run(until_idle=True)
        jobs[limit] = _spark_jobs(spark) - before
        assert sum(report.rows_written for report in reports) == 600
        rows[limit] = sorted(
            table_rows(commit_all(config), TABLE),
            key=lambda row: (row["_kfk_partition"], row["_kfk_offset"]),
        )

    assert jobs[20_000] == 0, "a 600-record batch ran as a Spark job"
    assert jobs[0] > 0
    assert len(rows[20_000]) == 600
    assert rows[20_000] == rows[0]


def test_a_column_widened_between_batches_takes_its_wider_values(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """The writer guesses a batch's schema versions from the batch before; a record of a newer
    version (here `n` widened from int to bigint, as after `ALTER TABLE ... MODIFY n BIGINT`)
    must not be cast into the older version's columns, but written with its own."""
    config = topic_config(tmp_path, unique_topic, {"ICEKEEPER__WRITER__ENGINE": "arrow"})
    source = config.sources[0]
    ensure_topic(source.bootstrap_servers, unique_topic, 1)
    framer = ConfluentAvroFramer(
        SchemaRegistryClient({"url": source.schema_registry_url}), unique_topic
    )
    producer = Producer({"bootstrap.servers": source.bootstrap_servers})
    job = WriterJob(config, spark=spark)
    for number, avro_type, value in ((1, "int", 7), (2, "long", 2**40)):
        shape = TableShape(
            server="s",
            db="shop",
            table="orders",
            columns=(Column("id", "int", optional=False), Column("n", avro_type)),
            key=("id",),
        )
        schema_id = framer.schema_id(shape.value_schema(), is_key=False)
        at = BinlogPosition(ts_ms=1_767_225_600_000 + number, file="b.1", pos=number, gtid="0-1-1")
        row = {"id": number, "n": value}
        producer.produce(
            unique_topic,
            value=framer.frame(schema_id, envelope(shape, "c", None, row, at, at.ts_ms)),
        )
        producer.flush()
        job.run(until_idle=True)

    rows = table_rows(commit_all(config), TABLE)
    assert sorted((row["id"], row["n"]) for row in rows) == [(1, 7), (2, 2**40)]
