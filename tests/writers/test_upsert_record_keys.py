"""Upsert tables: deletes without a `before` image take their key from the Kafka record key, and a
change of primary key (Debezium's delete of the old key and create of the new) leaves only the new
key (issue 13, item 2).

Each stream is spelt out record by record, keyed as Debezium keys it (its `Key` struct, framed
Avro under `<topic>-key`, or JSON with or without Connect's schema/payload envelope), written in
batches of a known size, each committed before the next, and read back as a user would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.config.model import TableSpec
from icekeeper.samples.debezium import BinlogPosition, Column, TableShape, envelope
from icekeeper.samples.produce import produce_debezium_records
from icekeeper.writers.dead_letters import REASON_HEADER
from icekeeper.writers.job import BatchReport, WriterJob
from icekeeper.writers.key_columns import RecordKeys, avro_key_schemas, record_keys_for, row_record
from tests.support.pipeline import pipeline_config

ORDERS = TableShape(
    "rk",
    "shop",
    "orders",
    (
        Column("id", "int", optional=False),
        Column("region", "string", optional=False),
        Column("amount", "long"),
        Column("status", "string"),
    ),
    key=("region", "id"),
)
"""Debezium's key struct lists `region` first; the table's `primary_key` says `[id, region]`."""
FORMATS = {"avro": "avro-confluent", "json-schemas": "debezium-json", "json": "debezium-json"}


class Stream:
    """Debezium change events of `shape`, each with the record key Debezium gives it."""

    def __init__(self, shape: TableShape, key_of: Callable[[dict], Any] | None = None) -> None:
        """`key_of`: the record key of a row (default: Debezium's `Key` struct)."""
        self.shape = shape
        self.key_of = key_of or shape.key_of
        self.records: list[tuple[Any, dict[str, Any] | None]] = []

    def _event(self, op: str, before: dict | None, after: dict | None, key: Any) -> None:
        position = len(self.records)
        at = BinlogPosition(
            1_767_225_600_000 + position, "mysql-bin.000003", 4 + position, f"gtid-{position}"
        )
        self.records.append((key, envelope(self.shape, op, before, after, at, at.ts_ms + 5)))

    def create(self, row: dict) -> None:
        self._event("c", None, row, self.key_of(row))

    def update(self, before: dict, after: dict) -> None:
        self._event("u", before, after, self.key_of(after))

    def delete(self, row: dict, before_image: bool = True) -> None:
        """A delete keyed by `row`'s key; without `before_image`, the key is all it carries."""
        self._event("d", row if before_image else None, None, self.key_of(row))

    def delete_without_key(self) -> None:
        """A delete with neither a `before` image nor a record key: nothing says what it deletes."""
        self._event("d", None, None, None)

    def tombstone(self, row: dict) -> None:
        """Debezium's follow-up to a delete (`tombstones.on.delete`), for log compaction."""
        self.records.append((self.key_of(row), None))

    def batch(self, size: int) -> None:
        """Check that the records so far fill whole batches of `size` (a batch ends here)."""
        assert len(self.records) % size == 0, (
            f"{len(self.records)} records do not end a batch of {size}"
        )


def order(key: int, region: str, amount: int, status: str = "new") -> dict:
    return {"id": key, "region": region, "amount": amount, "status": status}


def run_batches(config: IcekeeperConfig, spark) -> tuple[list[BatchReport], Bookkeeper]:
    """Write batch after batch, the bookkeeper committing
    each before the next (keys meet across snapshots)."""
    writer, bookkeeper = WriterJob(config, spark=spark), Bookkeeper(config)
    reports = []
    while batch := writer.run(max_batches=1, until_idle=True):
        reports += batch
        bookkeeper.run_cycle()
    while bookkeeper.run_cycle().committed_monikers:
        pass
    return reports, bookkeeper


def dead_letter_reasons(config: IcekeeperConfig, topic: str) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": config.sources[0].bootstrap_servers,
            "group.id": "dlq-reader",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        end = sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        )
        reasons: list[str] = []
        while len(reasons) < end and (message := consumer.poll(5)) is not None:
            if not message.error():
                reasons.append(dict(message.headers() or [])[REASON_HEADER].decode())
        return reasons
    finally:
        consumer.close()


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.parametrize("encoding", list(FORMATS))
def test_deletes_without_before_use_the_record_key_and_a_changed_key_leaves_only_the_new(
    local_stack, spark, tmp_path: Path, unique_topic: str, encoding: str
) -> None:
    stream, size = Stream(ORDERS), 6
    rows = {
        key: order(key, region, key * 10)
        for key, region in [
            (1, "eu"),
            (2, "eu"),
            (3, "us"),
            (4, "us"),
            (5, "eu"),
            (6, "us"),
            (7, "eu"),
            (8, "us"),
            (9, "eu"),
        ]
    }
    for key in (1, 2, 3, 4, 5, 8):
        stream.create(rows[key])
    stream.batch(size)
    stream.delete(rows[1], before_image=False)  # a row of an earlier batch
    stream.tombstone(rows[1])
    stream.update(rows[2], order(2, "eu", 21, "paid"))
    stream.create(rows[6])
    stream.delete(rows[6], before_image=False)  # a row of this batch
    stream.delete_without_key()  # to the dead letters
    stream.batch(size)
    # Primary key 4 -> 44 within this batch; 5 -> 55 across batches (the create comes next batch).
    stream.delete(rows[4])
    stream.tombstone(rows[4])
    stream.create(order(44, "us", 40))
    stream.create(rows[7])
    stream.delete(rows[8], before_image=False)
    stream.delete(rows[5])
    stream.batch(size)
    stream.create(order(55, "eu", 50))
    stream.delete(rows[7])  # 7 -> 77, both in this batch, 7 created in the one before
    stream.create(order(77, "eu", 70))
    stream.delete(rows[3], before_image=False)
    stream.update(order(44, "us", 40), order(44, "us", 41, "paid"))
    stream.create(rows[9])
    stream.batch(size)

    dead_letter_topic = unique_topic + ".dlq"
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__FORMAT": FORMATS[encoding],
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": str(size),
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": dead_letter_topic,
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id, region]",
        },
    )
    assert config.tables[0].upsert
    produce_debezium_records(config, ORDERS, stream.records, unique_topic, encoding=encoding)
    reports, bookkeeper = run_batches(config, spark)

    assert [report.records_read for report in reports] == [size] * 4
    table = bookkeeper.catalog.load_table("shop.orders")
    live = sorted(
        (row["id"], row["region"], row["amount"], row["status"])
        for row in table.scan().to_arrow().to_pylist()
    )
    assert live == [
        (2, "eu", 21, "paid"),
        (9, "eu", 90, "new"),
        (44, "us", 41, "paid"),
        (55, "eu", 50, "new"),
        (77, "eu", 70, "new"),
    ]
    # The keyless delete is the one dead letter, and the counts reconcile: every record read is
    # written, dead-lettered or a skipped tombstone.
    assert sum(report.dead_lettered for report in reports) == 1
    assert {kind: count for report in reports for kind, count in report.errors.items()} == {
        "delete-without-key": 1
    }
    assert sum(report.tombstones_skipped for report in reports) == 2
    assert dead_letter_reasons(config, dead_letter_topic) == ["delete-without-key"]


SINGLE = TableShape(
    "rk",
    "shop",
    "tags",
    (Column("id", "long", optional=False), Column("name", "string")),
    key=("id",),
)


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.parametrize("encoding", ["avro", "json"])
def test_a_primitive_record_key_stands_for_a_one_column_primary_key(
    local_stack, spark, tmp_path: Path, unique_topic: str, encoding: str
) -> None:
    """Keys set by other producers (or Connect's
    `ExtractField$Key`) are often the bare key value."""
    stream, size = Stream(SINGLE, key_of=lambda row: row["id"]), 3
    rows = {key: {"id": key, "name": f"tag {key}"} for key in (1, 2, 3, 4)}
    for key in (1, 2, 3):
        stream.create(rows[key])
    stream.batch(size)
    stream.delete(rows[1], before_image=False)
    stream.create(rows[4])
    stream.delete(rows[2], before_image=False)
    stream.batch(size)
    # `ID` as the config spells it, `id` as the row does: the key is still this column.
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__FORMAT": FORMATS[encoding],
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": str(size),
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.tags",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[ID]",
        },
    )
    produce_debezium_records(config, SINGLE, stream.records, unique_topic, encoding=encoding)
    reports, bookkeeper = run_batches(config, spark)

    assert [report.records_read for report in reports] == [size] * 2
    assert sum(report.dead_lettered for report in reports) == 0
    assert sorted(
        row["id"]
        for row in bookkeeper.catalog.load_table("shop.tags").scan().to_arrow().to_pylist()
    ) == [3, 4]


# -- which keys can be read as which rows (no services) --------------------------------------------


def test_a_key_is_read_as_the_key_columns_only_when_avro_can_resolve_each_of_its_fields() -> None:
    """A key schema the row cannot take is left out (its deletes are dead-lettered) rather than
    handed to Spark, whose `from_avro` would fail the whole batch on it."""
    row = row_record(ORDERS.value_schema())
    assert row is not None and [field["name"] for field in row["fields"]] == [
        "id",
        "region",
        "amount",
        "status",
    ]
    keys = RecordKeys(("ID", "region"))
    readable = avro_key_schemas(row, ORDERS.key_schema(), keys)
    assert readable is not None
    # The reader is the row's key columns, as the row spells them, each optional (a column the
    # key lacks reads as null).
    reader = json.loads(readable[1])["fields"]
    assert [(field["name"], field["type"], field["default"]) for field in reader] == [
        ("id", ["null", "int"], None),
        ("region", ["null", "string"], None),
    ]

    def key_of(field_type: str, name: str = "id") -> dict:
        return {**ORDERS.key_schema(), "fields": [{"name": name, "type": field_type}]}

    assert avro_key_schemas(row, key_of("int"), keys) is not None
    assert (
        avro_key_schemas(row, key_of("long"), keys) is None
    )  # long into an int column: no Avro promotion
    assert avro_key_schemas(row, key_of("int", name="region"), keys) is None
    assert (
        avro_key_schemas(row, key_of("int", name="amount"), keys) is None
    )  # no key column of the table
    assert (
        avro_key_schemas(row, key_of("int", name="amount"), RecordKeys(("amount",))) is not None
    )  # int into long: promoted
    assert avro_key_schemas(row, "int", keys) is None  # a bare key needs a one-column key
    assert avro_key_schemas(row, "int", RecordKeys(("ID",), single_column="ID")) is not None


def test_keys_are_read_for_keyed_tables_and_a_bare_key_only_for_one_agreed_column() -> None:
    def table(name: str, key: list[str]) -> TableSpec:
        return TableSpec(identifier=f"shop.{name}", primary_key=key)

    assert record_keys_for([table("audit", [])]) is None
    both = record_keys_for([table("a", ["ID"]), table("b", ["id"]), table("audit", [])])
    assert both is not None and both.columns == ("id",) and both.single_column == "id"
    wider = record_keys_for([table("a", ["id"]), table("b", ["id", "region"])])
    assert wider is not None and wider.columns == ("id", "region") and wider.single_column is None
    other = record_keys_for([table("a", ["id"]), table("b", ["code"])])
    assert other is not None and other.columns == ("id", "code") and other.single_column is None
