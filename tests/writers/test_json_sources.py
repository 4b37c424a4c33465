"""JSON sources keep their types (issue 12, problem 6).

Debezium JSON with Kafka Connect's schema envelope (JsonConverter, `schemas.enable=true`) lands
with the same Iceberg types and values as Debezium Avro (tests/writers/test_debezium_types.py):
the schema each record carries is read, not guessed from the payload. Schemaless JSON is
inferred per topic, so tables fed by different topics keep their own columns and types. The
records below are shaped as Debezium 3.5's MariaDB connector writes them through JsonConverter
(schema and payload as captured from the stack's connector).
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.samples.produce import ensure_topic
from icekeeper.writers.job import WriterJob
from tests.support.carriers import UTC, days, micros, time_micros
from tests.support.connect_json import (
    TYPES_ROW,
    b64,
    connect_decimal,
    decimal_field,
    envelope_schema,
    event,
    field,
)
from tests.support.pipeline import pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def produce(bootstrap_servers: str, topic: str, values: list[Any]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    for value in values:
        producer.produce(
            topic, value=json.dumps(value, ensure_ascii=False).encode("utf-8"), partition=0
        )
    producer.flush()


# -- (a) Debezium JSON with schemas: MariaDB's types -----------------------------------------------

ALL_BYTES = bytes(range(256))
# (op, row as JsonConverter carries it, what the Iceberg row must hold)
CASES = [
    (
        "c",
        {
            "id": 1,
            "small": -32768,
            "big": 2**63 - 1,
            "amount": connect_decimal(Decimal("-12345678.90"), 2),
            "payload": b64(b"\x00\xff\x80"),
            "d": days(dt.date(1000, 1, 1)),
            "dt6": micros(dt.datetime(1969, 12, 31, 23, 59, 59, 999999)),
            "ts": "1970-01-01T00:00:00Z",
            "t": time_micros(838, 59, 59, negative=True),
            "doc": '{"a": [1, "中文", "😀"]}',
            "name": "中文 😀",
        },
        {
            "id": 1,
            "small": -32768,
            "big": 2**63 - 1,
            "amount": Decimal("-12345678.90"),
            "payload": b"\x00\xff\x80",
            "d": dt.date(1000, 1, 1),
            "dt6": dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
            "ts": dt.datetime(1970, 1, 1, tzinfo=UTC),
            "t": "-838:59:59",
            "doc": '{"a": [1, "中文", "😀"]}',
            "name": "中文 😀",
        },
    ),
    (
        "c",
        {
            "id": 2,
            "small": 32767,
            "big": -(2**63),
            "amount": connect_decimal(Decimal("0.01"), 2),
            "payload": "",
            "d": days(dt.date(9999, 12, 31)),
            "dt6": micros(dt.datetime(2024, 2, 29, 12, 34, 56, 789012)),
            "ts": "2024-02-29T12:34:56.789012Z",
            "t": time_micros(838, 59, 59, 500000),
            "doc": "[]",
            "name": "",
        },
        {
            "id": 2,
            "small": 32767,
            "big": -(2**63),
            "amount": Decimal("0.01"),
            "payload": b"",
            "d": dt.date(9999, 12, 31),
            "dt6": dt.datetime(2024, 2, 29, 12, 34, 56, 789012),
            "ts": dt.datetime(2024, 2, 29, 12, 34, 56, 789012, tzinfo=UTC),
            "t": "838:59:59.500000",
            "doc": "[]",
            "name": "",
        },
    ),
    (
        "c",
        {
            "id": 3,
            "small": None,
            "big": None,
            "amount": connect_decimal(Decimal("99999999.99"), 2),
            "payload": b64(ALL_BYTES),
            "d": None,
            "dt6": None,
            "ts": None,
            "t": time_micros(12, 0, 0, 1),
            "doc": None,
            "name": None,
        },
        {
            "id": 3,
            "small": None,
            "big": None,
            "amount": Decimal("99999999.99"),
            "payload": ALL_BYTES,
            "d": None,
            "dt6": None,
            "ts": None,
            "t": "12:00:00.000001",
            "doc": None,
            "name": None,
        },
    ),
    # A delete carries the row in `before`: converted the same way.
    (
        "d",
        {
            "id": 4,
            "small": 7,
            "big": 8,
            "amount": connect_decimal(Decimal("-0.01"), 2),
            "payload": b64("中".encode()),
            "d": days(dt.date(1969, 12, 31)),
            "dt6": 0,
            "ts": "2000-01-01T00:00:00.5Z",
            "t": 0,
            "doc": "{}",
            "name": "😀",
        },
        {
            "id": 4,
            "small": 7,
            "big": 8,
            "amount": Decimal("-0.01"),
            "payload": "中".encode(),
            "d": dt.date(1969, 12, 31),
            "dt6": dt.datetime(1970, 1, 1),
            "ts": dt.datetime(2000, 1, 1, 0, 0, 0, 500000, tzinfo=UTC),
            "t": "00:00:00",
            "doc": "{}",
            "name": "😀",
        },
    ),
]
NOT_MATCHING = [
    {**CASES[0][1], "id": 5, "payload": "not base64!"},
    {**CASES[0][1], "id": 6, "amount": 1.5},
]
"""Bytes that are no base64, and a decimal written as a number (JsonConverter's
`decimal.format=NUMERIC`, not read), are not taken as null: the records go to the dead letters."""
TOO_WIDE = {**CASES[0][1], "id": 7, "amount": connect_decimal(Decimal("123456789.01"), 2)}
"""Eleven digits do not fit the column's decimal(10, 2): a dead letter, not null."""
WIDE_DECIMAL_REASON = (
    "unsupported-connect-schema: before.num: decimal(65, 30) does not fit an Iceberg decimal (at "
    "most 38 digits)"
)
"""MariaDB's DECIMAL(65,30) holds more digits than any
Iceberg decimal: its records are dead-lettered, named."""


def test_debezium_json_with_schemas_keeps_mariadb_types_and_values(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__FORMAT": "debezium-json",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.types",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": f"{unique_topic}.dlq",
        },
    )
    source = config.sources[0]
    ensure_topic(source.bootstrap_servers, unique_topic, 1)
    schema = envelope_schema("s", "shop", "types", TYPES_ROW)
    values = [
        {
            "schema": schema,
            "payload": event(
                "s", "shop", "types", op, *((row, None) if op == "d" else (None, row)), index
            ),
        }
        for index, (op, row, _) in enumerate(CASES)
    ]
    values += [
        {"schema": schema, "payload": event("s", "shop", "types", "c", None, row, 10 + index)}
        for index, row in enumerate([*NOT_MATCHING, TOO_WIDE])
    ]
    wide = envelope_schema("s", "shop", "types", [*TYPES_ROW, decimal_field("num", 65, 30)])
    values.append(
        {
            "schema": wide,
            "payload": event(
                "s",
                "shop",
                "types",
                "c",
                None,
                {**CASES[0][1], "id": 8, "num": connect_decimal(Decimal("1.5"), 30)},
                20,
            ),
        }
    )
    produce(source.bootstrap_servers, unique_topic, values)

    reports = WriterJob(config, spark=spark).run(until_idle=True)
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()

    errors: dict[str, int] = {}
    for report in reports:
        for reason, count in report.errors.items():
            errors[reason] = errors.get(reason, 0) + count
    assert errors == {
        "payload-does-not-match-schema": 2,
        "unconvertible-value": 1,
        WIDE_DECIMAL_REASON: 1,
    }
    table = bookkeeper.catalog.load_table("shop.types")
    types = {f.name: str(f.field_type) for f in table.schema().fields if not f.name.startswith("_")}
    assert types == {
        "id": "int",
        "small": "int",
        "big": "long",
        "amount": "decimal(10, 2)",
        "payload": "binary",
        "d": "date",
        "dt6": "timestamp",
        "ts": "timestamptz",
        "t": "string",
        "doc": "string",
        "name": "string",
    }
    rows = table.scan(selected_fields=("_src_op", *types)).to_arrow().sort_by("id").to_pylist()
    assert rows == [{"_src_op": op, **expected} for op, _, expected in CASES]


# -- (b) two topics, two tables, one column name with two types ------------------------------------

ORDERS_ROW = [field("id", "int32", optional=False), field("qty", "int32"), field("note", "string")]
CUSTOMERS_ROW = [
    field("id", "int32", optional=False),
    field("qty", "string"),
    field("name", "string"),
]
ORDERS = [{"id": i, "qty": i * 10, "note": f"n{i}"} for i in range(20)]
CUSTOMERS = [{"id": i, "qty": f"q{i}", "name": f"c{i}"} for i in range(30)]


@pytest.mark.parametrize(
    "shape", ["json", "debezium-json-schemaless", "debezium-json-with-schemas"]
)
def test_two_topics_of_one_json_source_keep_their_own_columns_and_types(
    local_stack, spark, tmp_path: Path, unique_topic: str, shape: str
) -> None:
    orders_topic, customers_topic = f"{unique_topic}.orders", f"{unique_topic}.customers"
    config = pipeline_config(
        tmp_path,
        orders_topic,
        {
            "ICEKEEPER__SOURCES__0__FORMAT": "json" if shape == "json" else "debezium-json",
            "ICEKEEPER__SOURCES__0__TOPICS": f"[{orders_topic}, {customers_topic}]",
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": f"{unique_topic}.dlq",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__TOPICS": f"[{orders_topic}]",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            "ICEKEEPER__TABLES__1__IDENTIFIER": "shop.customers",
            "ICEKEEPER__TABLES__1__TOPICS": f"[{customers_topic}]",
            "ICEKEEPER__TABLES__1__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__1__MODE": "changelog",
        },
    )
    source = config.sources[0]
    for topic, table, row_fields, rows in (
        (orders_topic, "orders", ORDERS_ROW, ORDERS),
        (customers_topic, "customers", CUSTOMERS_ROW, CUSTOMERS),
    ):
        ensure_topic(source.bootstrap_servers, topic, 1)
        if shape == "json":
            values: list[Any] = rows
        else:
            values = [
                event("s", "shop", table, "c", None, row, index) for index, row in enumerate(rows)
            ]
            if shape == "debezium-json-with-schemas":
                values = [
                    {"schema": envelope_schema("s", "shop", table, row_fields), "payload": payload}
                    for payload in values
                ]
        produce(source.bootstrap_servers, topic, values)

    job = WriterJob(config, spark=spark)
    reports = job.run(until_idle=True)
    assert all(not r.errors for r in reports), [r.errors for r in reports]
    # JSON runs on `spark-sql`: each batch counts as the arrow engine's fallback, by kind.
    fallbacks = job.metrics.registry.get_sample_value(
        "icekeeper_writer_engine_fallbacks_total",
        {"source": source.name, "reason": "unsupported-source"},
    )
    assert reports and fallbacks == len(reports)
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()

    # Schemaless JSON cannot tell an int from a long: inferred numbers are `long` (docs/types.md).
    integer = "int" if shape == "debezium-json-with-schemas" else "long"

    def row_columns(identifier: str) -> dict[str, str]:
        return {
            f.name: str(f.field_type)
            for f in bookkeeper.catalog.load_table(identifier).schema().fields
            if not f.name.startswith("_")
        }

    assert row_columns("shop.orders") == {"id": integer, "qty": integer, "note": "string"}
    assert row_columns("shop.customers") == {"id": integer, "qty": "string", "name": "string"}
    orders = (
        bookkeeper.catalog.load_table("shop.orders")
        .scan(selected_fields=("id", "qty", "note"))
        .to_arrow()
        .sort_by("id")
        .to_pylist()
    )
    customers = (
        bookkeeper.catalog.load_table("shop.customers")
        .scan(selected_fields=("id", "qty", "name"))
        .to_arrow()
        .sort_by("id")
        .to_pylist()
    )
    assert orders == ORDERS and customers == CUSTOMERS
