"""`writer.engine: arrow` writes the same tables as `spark-sql` from the same Kafka input (issue 15,
items 4-5): same rows, field ids, column metrics and dead letters, over the Debezium semantic
types the real-source tests meet, two schema versions, and poison records."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.samples.debezium import BinlogPosition, Column, TableShape, envelope
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic
from icekeeper.samples.readback import topic_messages
from icekeeper.writers.job import WriterJob
from tests.support.debezium_types import CASES, COLUMNS, UNCONVERTIBLE
from tests.support.pipeline import pipeline_config

# Two writers, two bookkeepers and the dead-letter passes: minutes on the shared 2-core machine.
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.heavy]

ADDED = (*COLUMNS, Column("added", "int"))


def _produce(config: IcekeeperConfig, topic: str, other_tables: tuple[str, ...] = ()) -> None:
    """Changes of two schema versions (inserts, an update, a delete), values that do not convert,
    and poison: a bad magic byte, an unknown schema id, a cut-off body, a tombstone; then the
    inserts again as rows of each of `other_tables` (same database, schemas of their own)."""
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
    for name in other_tables:
        other = TableShape(server="s", db="shop", table=name, columns=COLUMNS, key=("id",))
        other_id = framer.schema_id(other.value_schema(), is_key=False)
        for index, row in enumerate(rows):
            at = BinlogPosition(ts_ms=1_767_225_800_000 + index, file="b.2", pos=index, gtid="g")
            values.append(framer.frame(other_id, envelope(other, "c", None, row, at, at.ts_ms)))
    producer = Producer({"bootstrap.servers": source.bootstrap_servers})
    for number, value in enumerate(values):
        producer.produce(topic, key=f"k{number}".encode(), value=value, partition=0)
    producer.flush()


def _written(config: IcekeeperConfig, spark, identifiers: list[str]) -> tuple:
    """Run the writer and the bookkeeper; the tables, the writer's reports, and the dead
    letters."""
    reports = WriterJob(config, spark=spark).run(until_idle=True)
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    tables = [bookkeeper.catalog.load_table(identifier) for identifier in identifiers]
    source = config.sources[0]
    dead = [
        (message.key(), message.value(), sorted(message.headers() or []))
        for message in topic_messages(source, source.dead_letter_topic, timeout_s=60)
    ]
    return tables, reports, dead


def _file_metrics(table) -> list[dict]:
    files = table.inspect.files().to_pylist()
    keep = (
        "partition",
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


PARTITIONED = {
    # Every transform writers take, over the semantic types' columns: identity (strings, with an
    # empty one and a null), year/month/day/hour of dates and timestamps (years 1000 and 9999),
    # bucket of ints and decimals, truncate of ints and strings (multi-byte characters).
    "ICEKEEPER__TABLES__0__PARTITION_BY": "['day(dt3)', 'month(ts)', 'year(d)', "
    "'hour(_kfk_timestamp)', 'bucket(4, id)', 'bucket(3, amount)', 'truncate(2, note)', "
    "'truncate(10, id)', color]",
    # As a Spark job (the tasks and their partition specs pickled to Python workers).
    "ICEKEEPER__WRITER__DRIVER_BATCH_RECORDS": "0",
}
TEMPLATED = {
    # shop.types claims its own records; the template names a table for each other one.
    "ICEKEEPER__TABLES__0__SOURCE_TABLE": "types",
    "ICEKEEPER__SOURCES__0__TABLE_TEMPLATE": "cdc.{db}_{table}",
}
SCENARIOS = {
    "unpartitioned": ({}, ()),
    "partitioned": (PARTITIONED, ()),
    "templated": (TEMPLATED, ("other", "more")),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_arrow_engine_writes_the_tables_spark_sql_writes(
    local_stack, spark, tmp_path: Path, unique_topic: str, scenario: str
) -> None:
    layout, other_tables = SCENARIOS[scenario]
    identifiers = ["shop.types", *[f"cdc.shop_{name}" for name in other_tables]]
    settings = {
        "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.types",
        "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
        "ICEKEEPER__TABLES__0__MODE": "changelog",
        **layout,
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
    _produce(configs["arrow"], unique_topic, other_tables)

    spark_tables, spark_reports, spark_dead = _written(configs["spark-sql"], spark, identifiers)
    arrow_tables, arrow_reports, arrow_dead = _written(configs["arrow"], spark, identifiers)

    for arrow_table, spark_table in zip(arrow_tables, spark_tables, strict=True):
        # The arrow engine wrote these files itself (Spark names its files part-<uuid>-c000).
        arrow_files = arrow_table.inspect.files().column("file_path").to_pylist()
        assert arrow_files and all(not path.endswith("c000.zstd.parquet") for path in arrow_files)
        assert all(arrow_table.inspect.files().column("record_count").to_pylist())
        assert all(
            path.endswith("c000.zstd.parquet")
            for path in spark_table.inspect.files().column("file_path").to_pylist()
        )
        assert str(arrow_table.spec()) == str(spark_table.spec())
        assert str(arrow_table.schema()) == str(spark_table.schema())
        arrow_rows = arrow_table.scan().to_arrow().sort_by("_kfk_offset")
        spark_rows = spark_table.scan().to_arrow().sort_by("_kfk_offset")
        assert arrow_rows.to_pylist() == spark_rows.to_pylist()
        # Both engines give an empty string's partition as '' (asserted below) and commit no
        # file of no records.
        assert _file_metrics(arrow_table) == _file_metrics(spark_table)
    types = arrow_tables[0]
    assert "added" in types.schema().column_names
    assert types.scan().to_arrow().num_rows == 5
    for name, table in zip(other_tables, arrow_tables[1:], strict=True):
        assert "added" not in table.schema().column_names
        assert set(table.scan().to_arrow().column("_src_table").to_pylist()) == {name}
    if layout is PARTITIONED:
        assert len(types.spec().fields) == 9 and len(types.inspect.files()) >= 3
        for table in (types, spark_tables[0]):
            blank_color = table.scan(row_filter="color = ''").to_arrow()
            assert blank_color.column("id").to_pylist() == [2, 2]

    errors = lambda reports: [(r.records_read, r.rows_written, r.errors) for r in reports]  # noqa: E731
    assert errors(arrow_reports) == errors(spark_reports)
    # Spark's dead-letter write runs as several tasks: the topic's order is not the batch's.
    assert len(arrow_dead) == 5
    assert sorted(arrow_dead) == sorted(spark_dead)


def _produce_transactions(config: IcekeeperConfig, topic: str) -> None:
    """Three transactions of inserts: committed, aborted, committed."""
    source = config.sources[0]
    ensure_topic(source.bootstrap_servers, topic, 1)
    shape = TableShape(server="s", db="shop", table="types", columns=COLUMNS, key=("id",))
    framer = ConfluentAvroFramer(SchemaRegistryClient({"url": source.schema_registry_url}), topic)
    schema_id = framer.schema_id(shape.value_schema(), is_key=False)
    producer = Producer(
        {"bootstrap.servers": source.bootstrap_servers, "transactional.id": f"{topic}-tx"}
    )
    producer.init_transactions(30)
    for number, commit in enumerate((True, False, True)):
        producer.begin_transaction()
        for case, _ in CASES:
            row = {**case, "id": 10 * number + case["id"]}
            at = BinlogPosition(ts_ms=1_767_225_600_000, file="b.1", pos=4, gtid="0-1-1")
            value = framer.frame(schema_id, envelope(shape, "c", None, row, at, at.ts_ms))
            producer.produce(topic, value=value, partition=0)
        producer.flush()  # in the log before the abort (an abort drops what is still queued)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)


def test_arrow_engine_reads_with_the_sources_consumer_properties(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    # isolation.level (a librdkafka name too) leaves the aborted transaction out on both engines;
    # fetch.max.wait.ms is librdkafka's fetch.wait.max.ms; max.poll.records changes no record.
    properties = (
        "{isolation.level: read_committed, fetch.max.wait.ms: '100', max.poll.records: '50'}"
    )
    configs = {
        engine: pipeline_config(
            tmp_path / engine,
            unique_topic,
            {
                "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.types",
                "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
                "ICEKEEPER__TABLES__0__MODE": "changelog",
                "ICEKEEPER__SOURCES__0__CONSUMER_PROPERTIES": properties,
                "ICEKEEPER__SOURCES__0__OFFSET_GAPS": "true",
                "ICEKEEPER__WRITER__ENGINE": engine,
            },
        )
        for engine in ("spark-sql", "arrow")
    }
    _produce_transactions(configs["arrow"], unique_topic)

    [spark_table], _, _ = _written(configs["spark-sql"], spark, ["shop.types"])
    [arrow_table], _, _ = _written(configs["arrow"], spark, ["shop.types"])

    arrow_files = arrow_table.inspect.files().column("file_path").to_pylist()
    assert arrow_files and all(not path.endswith("c000.zstd.parquet") for path in arrow_files)
    arrow_rows = arrow_table.scan().to_arrow().sort_by("_kfk_offset")
    assert sorted(arrow_rows.column("id").to_pylist()) == [1, 2, 3, 21, 22, 23]
    assert (
        arrow_rows.to_pylist() == spark_table.scan().to_arrow().sort_by("_kfk_offset").to_pylist()
    )
