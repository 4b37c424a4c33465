"""Sources and routing: plain JSON, template routing by Debezium source, tombstones, two writers
sharing a topic, and consumer group offsets visible to ordinary Kafka tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.samples.produce import ensure_topic, produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec, synthetic_events
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_plain_json_rows_get_kafka_metadata_columns(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__FORMAT": "json",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "web.clicks",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[]",
        },
    )
    ensure_topic(config.sources[0].bootstrap_servers, unique_topic, 2)
    producer = Producer({"bootstrap.servers": config.sources[0].bootstrap_servers})
    for index in range(50):
        producer.produce(
            unique_topic,
            value=json.dumps(
                {"page": f"/p/{index % 5}", "user": index, "ms": 1.5 * index, "tags": [index, None]}
            ),
            partition=index % 2,
        )
    producer.produce(unique_topic, value=b"\xff not json", partition=0)
    producer.flush()
    reports = WriterJob(config, spark=spark).run(until_idle=True)
    assert sum(r.rows_written for r in reports) == 50 and sum(r.dead_lettered for r in reports) == 1
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    table = bookkeeper.catalog.load_table("web.clicks")
    assert [f.name for f in table.schema().fields] == [
        "_kfk_topic",
        "_kfk_partition",
        "_kfk_offset",
        "_kfk_timestamp",
        "ms",
        "page",
        "tags",
        "user",
    ]
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(r["user"] for r in rows) == list(range(50)) and {
        r["_kfk_topic"] for r in rows
    } == {unique_topic}
    # Arrays as JSON text: Spark gives list elements no
    # Parquet field ids, which Iceberg readers refuse.
    assert {r["user"]: r["tags"] for r in rows}[7] == "[7,null]"


def test_template_routes_each_source_table_to_its_own_iceberg_table(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = pipeline_config(
        tmp_path, unique_topic, {"ICEKEEPER__SOURCES__0__TABLE_TEMPLATE": "cdc.{db}_{table}"}
    )
    config = config.model_copy(
        update={"tables": []}
    )  # no table declared: the template names them all
    for table in ("orders", "refunds"):
        produce_synthetic(
            config,
            SyntheticSpec(seed=3, keys=50, events=300, schema_changes=0, table=table),
            topic=unique_topic,
            progress=lambda m: None,
        )
    WriterJob(config, spark=spark).run(until_idle=True)
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    for table in ("orders", "refunds"):
        rows = bookkeeper.catalog.load_table(f"cdc.shop_{table}").scan().to_arrow()
        assert rows.num_rows == 300 and set(rows.column("_src_table").to_pylist()) == {table}


def test_tombstones_are_skipped_and_counted_and_offsets_reconcile(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            "ICEKEEPER__SOURCES__0__CONSUMER_GROUP": "icekeeper-tombstones",
        },
    )
    produced = produce_synthetic(
        config,
        SyntheticSpec(seed=8, keys=40, events=200, schema_changes=0),
        topic=unique_topic,
        partitions=1,
        progress=lambda m: None,
    )
    producer = Producer({"bootstrap.servers": config.sources[0].bootstrap_servers})
    for key in range(5):  # Debezium follows a delete with a tombstone: the key and no value
        producer.produce(
            unique_topic, key=json.dumps({"id": key}).encode(), value=None, partition=0
        )
    producer.flush()
    reports = WriterJob(config, spark=spark).run(until_idle=True)
    assert (
        sum(r.tombstones_skipped for r in reports) == 5
        and sum(r.dead_lettered for r in reports) == 0
    )
    assert (
        sum(r.rows_written for r in reports) + 5
        == sum(r.records_read for r in reports)
        == produced["records"] + 5
    )
    # The consumer group's committed offsets show the writer's progress to ordinary Kafka tools.
    consumer = Consumer(
        {
            "bootstrap.servers": config.sources[0].bootstrap_servers,
            "group.id": "icekeeper-tombstones",
        }
    )
    [committed] = consumer.committed([TopicPartition(unique_topic, 0)], timeout=10)
    consumer.close()
    assert committed.offset == produced["records"] + 5


def test_two_writers_share_a_topic_by_partition(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    overrides = {
        "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
        "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
        "ICEKEEPER__TABLES__0__MODE": "changelog",
        "ICEKEEPER__WRITER__INSTANCE_COUNT": "2",
    }
    first = pipeline_config(
        tmp_path,
        unique_topic,
        {
            **overrides,
            "ICEKEEPER__WRITER__WRITER_ID": "w0",
            "ICEKEEPER__WRITER__INSTANCE_INDEX": "0",
        },
    )
    second = first.model_copy(
        update={"writer": first.writer.model_copy(update={"writer_id": "w1", "instance_index": 1})}
    )
    spec = SyntheticSpec(seed=12, keys=100, events=1200, schema_changes=0)
    produce_synthetic(first, spec, topic=unique_topic, partitions=4, progress=lambda m: None)
    rows_by_writer = {}
    for config in (first, second):
        job = WriterJob(config, spark=spark)
        rows_by_writer[config.writer.writer_id] = sum(
            r.rows_written for r in job.run(until_idle=True)
        )
        assert {
            o.partition % 2
            for m in job.transport.pending(writer_id=config.writer.writer_id)
            for o in m.offsets
        } == {config.writer.instance_index}
    bookkeeper = Bookkeeper(first)
    bookkeeper.run_cycle()
    rows = bookkeeper.catalog.load_table("shop.orders").scan().to_arrow()
    positions = list(
        zip(rows.column("_kfk_partition").to_pylist(), rows.column("_kfk_offset").to_pylist())
    )
    assert len(positions) == len(set(positions)) == 1200 == sum(rows_by_writer.values())
    assert all(count > 0 for count in rows_by_writer.values())
    assert len([e for e in synthetic_events(spec)]) == 1200
