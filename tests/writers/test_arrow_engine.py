"""`writer.engine: arrow` writes the same tables as `spark-sql` from the same Kafka input (issue 15,
items 4-5): same rows, field ids, column metrics and dead letters, over the Debezium semantic
types the real-source tests meet, two schema versions, and poison records."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient

from bookkeeper.service import Bookkeeper
from common.config.model import IcekeeperConfig
from icekeeper.samples.debezium import BinlogPosition, Column, TableShape, envelope
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic
from icekeeper.samples.readback import topic_messages
from tests.support.debezium_types import CASES, COLUMNS, UNCONVERTIBLE
from tests.support.pipeline import pipeline_config
from writers.job import WriterJob

# Two writers, two bookkeepers and the dead-letter passes: minutes on the shared 2-core machine.
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.heavy]

ADDED = (*COLUMNS, Column("added", "int"))


def _produce(config: IcekeeperConfig, topic: str) -> None:
    """Changes of two schema versions (inserts, an update, a delete), values that do not convert,
    and poison: a bad magic byte, an unknown schema id, a cut-off body, a tombstone."""
    source = config.sources[0]
    ensure_topic(source.bootstrap_servers, topic, 1)
    first = TableShape(server="s", db="shop", table="types", columns=COLUMNS, key=("id",))
    second = TableShape(server="s", db="shop", table="types", columns=ADDED, key=("id",))
    framer = ConfluentAvroFramer(SchemaRegistryClient({"url": source.schema_registry_url}), topic)
    first_id = framer.schema_id(first.value_schema(), is_key=False)
    second_id = framer.schema_id(second.value_schema(), is_key=False)
    rows = [case[0] for case in CASES]
    values: list[bytes | None] = []
    for index, row in enumerate(rows + UNCONVERTIBLE):
        at = BinlogPosition(
            ts_ms=1_767_225_600_000 + index, file="b.1", pos=4 + index, gtid=f"0-1-{index}"
        )
        values.append(framer.frame(first_id, envelope(first, "c", None, row, at, at.ts_ms)))
    at = BinlogPosition(ts_ms=1_767_225_700_000, file="b.1", pos=100, gtid="0-1-9")
    updated = {**rows[1], "note": "updated", "added": 7}
    values.append(
        framer.frame(second_id, envelope(second, "u", {**rows[1], "added": None}, updated, at, 5))
    )
    values.append(framer.frame(first_id, envelope(first, "d", rows[2], None, at, 6)))
    good = values[0]
    values += [
        b"\x01" + good[1:],
        struct.pack(">bI", 0, 987_654_321) + good[5:],
        good[:40],
        None,
    ]
    producer = Producer({"bootstrap.servers": source.bootstrap_servers})
    for number, value in enumerate(values):
        producer.produce(topic, key=f"k{number}".encode(), value=value, partition=0)
    producer.flush()


def _written(config: IcekeeperConfig, spark) -> tuple:
    """Run the writer and the bookkeeper; the table, the writer's reports, and the dead letters."""
    reports = WriterJob(config, spark=spark).run(until_idle=True)
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    table = bookkeeper.catalog.load_table("shop.types")
    source = config.sources[0]
    dead = [
        (message.key(), message.value(), sorted(message.headers() or []))
        for message in topic_messages(source, source.dead_letter_topic, timeout_s=60)
    ]
    return table, reports, dead


def _file_metrics(table) -> list[dict]:
    files = table.inspect.files().to_pylist()
    keep = (
        "record_count",
        "value_counts",
        "null_value_counts",
        "nan_value_counts",
        "lower_bounds",
        "upper_bounds",
    )
    described = [{key: _sorted_map(entry[key]) for key in keep} for entry in files]
    return sorted(described, key=lambda entry: repr(entry))


def _sorted_map(value):
    return sorted(value) if isinstance(value, list) else value


def test_arrow_engine_writes_the_tables_spark_sql_writes(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    settings = {
        "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.types",
        "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
        "ICEKEEPER__TABLES__0__MODE": "changelog",
    }
    configs = {
        engine: pipeline_config(
            tmp_path / engine,
            unique_topic,
            {
                **settings,
                "ICEKEEPER__WRITER__ENGINE": engine,
                "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": f"{unique_topic}.{engine}.dlq",
            },
        )
        for engine in ("spark-sql", "arrow")
    }
    _produce(configs["arrow"], unique_topic)

    spark_table, spark_reports, spark_dead = _written(configs["spark-sql"], spark)
    arrow_table, arrow_reports, arrow_dead = _written(configs["arrow"], spark)

    # The arrow engine wrote these files itself (Spark names its files part-<task>-<uuid>-c000).
    arrow_files = arrow_table.inspect.files().column("file_path").to_pylist()
    assert arrow_files and all(not path.endswith("-c000.zstd.parquet") for path in arrow_files)
    assert all(
        path.endswith("-c000.zstd.parquet")
        for path in spark_table.inspect.files().column("file_path").to_pylist()
    )

    assert str(arrow_table.schema()) == str(spark_table.schema())
    assert "added" in arrow_table.schema().column_names
    arrow_rows = arrow_table.scan().to_arrow().sort_by("_kfk_offset")
    spark_rows = spark_table.scan().to_arrow().sort_by("_kfk_offset")
    assert arrow_rows.num_rows == 5
    assert arrow_rows.to_pylist() == spark_rows.to_pylist()
    assert _file_metrics(arrow_table) == _file_metrics(spark_table)

    errors = lambda reports: [(r.records_read, r.rows_written, r.errors) for r in reports]  # noqa: E731
    assert errors(arrow_reports) == errors(spark_reports)
    # Spark's dead-letter write runs as several tasks: the topic's order is not the batch's.
    assert len(arrow_dead) == 5
    assert sorted(arrow_dead) == sorted(spark_dead)
