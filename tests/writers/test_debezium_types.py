"""Debezium's semantic types land as the Iceberg types users expect, edge values included
(issue 12, problem 5). The schema below is what Debezium's MariaDB connector registers for
DATE, DATETIME(3), DATETIME(6), TIMESTAMP, TIME, DECIMAL, JSON, ENUM, SET, BIT and GEOMETRY
columns, plus PostgreSQL's NUMERIC without scale and UUID; docs/types.md has the table."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.samples.debezium import BinlogPosition, TableShape, envelope
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic
from icekeeper.writers.job import WriterJob
from tests.support.debezium_types import CASES, COLUMNS, UNCONVERTIBLE
from tests.support.pipeline import pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_debezium_semantic_types_become_iceberg_types_with_edge_values(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.types",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": f"{unique_topic}.dlq",
        },
    )
    source = config.sources[0]
    ensure_topic(source.bootstrap_servers, unique_topic, 1)
    shape = TableShape(server="s", db="shop", table="types", columns=COLUMNS, key=("id",))
    framer = ConfluentAvroFramer(
        SchemaRegistryClient({"url": source.schema_registry_url}), unique_topic
    )
    value_id = framer.schema_id(shape.value_schema(), is_key=False)
    producer = Producer({"bootstrap.servers": source.bootstrap_servers})
    for index, row in enumerate([case[0] for case in CASES] + UNCONVERTIBLE):
        at = BinlogPosition(
            ts_ms=1_767_225_600_000 + index,
            file="binlog.000001",
            pos=4 + index,
            gtid=f"0-1-{index}",
        )
        producer.produce(
            unique_topic,
            value=framer.frame(value_id, envelope(shape, "c", None, row, at, at.ts_ms)),
            partition=0,
        )
    producer.flush()

    reports = WriterJob(config, spark=spark).run(until_idle=True)
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()

    assert sum(r.errors.get("unconvertible-value", 0) for r in reports) == 2
    table = bookkeeper.catalog.load_table("shop.types")
    types = {f.name: str(f.field_type) for f in table.schema().fields if not f.name.startswith("_")}
    assert types == {
        "id": "int",
        "d": "date",
        "dt3": "timestamp",
        "dt6": "timestamp",
        "ts": "timestamptz",
        "t": "string",
        "amount": "decimal(10, 2)",
        "huge": "string",
        "big": "string",
        "doc": "string",
        "color": "string",
        "tags": "string",
        "flags": "binary",
        "shape": "binary",
        "ref": "string",
        "note": "string",
    }
    rows = table.scan(selected_fields=tuple(types)).to_arrow().sort_by("id").to_pylist()
    assert rows == [case[1] for case in CASES]
