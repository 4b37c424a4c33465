"""Each table's schema comes only from the records routed to it (issue 12, problems 1-4).

Two Debezium tables of one source share a batch: columns never leak from one to the other, a
column name the two use with different types stops nothing, an ALTER on one leaves the other
alone, and a column the source dropped is dropped (or kept, null) as configured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.readers import duckdb_rows, spark_rows
from icekeeper.samples.debezium import BinlogPosition, Column, TableShape, envelope
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ORDERS = (Column("id", "int", optional=False), Column("qty", "int"), Column("note", "string"))
CUSTOMERS = (Column("id", "int", optional=False), Column("qty", "string"), Column("name", "string"))


def shape(server: str, table: str, columns: tuple[Column, ...]) -> TableShape:
    return TableShape(server=server, db="shop", table=table, columns=columns, key=("id",))


def produce_creates(config, topic: str, table: TableShape, rows: list[dict[str, Any]]) -> None:
    """Debezium create events for `rows`, framed with the table's value schema at this version."""
    source = config.sources[0]
    framer = ConfluentAvroFramer(SchemaRegistryClient({"url": source.schema_registry_url}), topic)
    value_id = framer.schema_id(_as_debezium_registers_it(table.value_schema()), is_key=False)
    producer = Producer({"bootstrap.servers": source.bootstrap_servers})
    for index, row in enumerate(rows):
        at = BinlogPosition(
            ts_ms=1_767_225_600_000 + index,
            file="binlog.000001",
            pos=4 + index,
            gtid=f"0-1-{index}",
        )
        producer.produce(
            topic,
            value=framer.frame(value_id, envelope(table, "c", None, row, at, at.ts_ms)),
            partition=0,
        )
    producer.flush()


def _as_debezium_registers_it(schema: dict[str, Any]) -> dict[str, Any]:
    """Debezium's Avro names the row record `Value` with no namespace of its own (it inherits the
    envelope's), which is what broke namespace-based filtering; registered that way here."""
    before = schema["fields"][0]["type"][1]
    before.pop("namespace", None)
    schema["fields"][1]["type"] = ["null", "Value"]
    return schema


def run_pipeline(config, spark, job: WriterJob | None = None) -> Bookkeeper:
    """Write what is in Kafka (with `job`: a writer that remembers its last batch) and commit it."""
    reports = (job or WriterJob(config, spark=spark)).run(until_idle=True)
    assert all(not r.errors for r in reports), [r.errors for r in reports]
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    return bookkeeper


def row_columns(bookkeeper: Bookkeeper, identifier: str) -> dict[str, str]:
    schema = bookkeeper.catalog.load_table(identifier).schema()
    return {f.name: str(f.field_type) for f in schema.fields if not f.name.startswith("_")}


def two_table_config(
    tmp_path: Path,
    orders_topic: str,
    customers_topic: str,
    by_source_table: bool,
    extra: dict[str, str] | None = None,
):
    environ = {
        "ICEKEEPER__SOURCES__0__TOPICS": f"[{orders_topic}, {customers_topic}]",
        "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
        "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
        "ICEKEEPER__TABLES__1__IDENTIFIER": "shop.customers",
        "ICEKEEPER__TABLES__1__PRIMARY_KEY": "[id]",
    }
    if by_source_table:
        environ.update(
            {
                "ICEKEEPER__TABLES__0__TOPICS": "[]",
                "ICEKEEPER__TABLES__0__SOURCE_DB": "shop",
                "ICEKEEPER__TABLES__0__SOURCE_TABLE": "orders",
                "ICEKEEPER__TABLES__1__SOURCE_DB": "shop",
                "ICEKEEPER__TABLES__1__SOURCE_TABLE": "customers",
            }
        )
    else:
        environ.update(
            {
                "ICEKEEPER__TABLES__0__TOPICS": f"[{orders_topic}]",
                "ICEKEEPER__TABLES__1__TOPICS": f"[{customers_topic}]",
            }
        )
    environ.update(extra or {})
    return pipeline_config(tmp_path, orders_topic, environ)


@pytest.mark.parametrize("by_source_table", [False, True], ids=["by-topic", "by-source-table"])
def test_two_tables_in_one_batch_keep_their_own_columns_and_types(
    local_stack, spark, tmp_path: Path, unique_topic: str, by_source_table: bool
) -> None:
    orders_topic, customers_topic = f"{unique_topic}.orders", f"{unique_topic}.customers"
    config = two_table_config(tmp_path, orders_topic, customers_topic, by_source_table)
    for topic in (orders_topic, customers_topic):
        ensure_topic(config.sources[0].bootstrap_servers, topic, 1)
    produce_creates(
        config,
        orders_topic,
        shape("s", "orders", ORDERS),
        [{"id": i, "qty": i * 10, "note": f"n{i}"} for i in range(20)],
    )
    produce_creates(
        config,
        customers_topic,
        shape("s", "customers", CUSTOMERS),
        [{"id": i, "qty": f"q{i}", "name": f"c{i}"} for i in range(30)],
    )

    bookkeeper = run_pipeline(config, spark)

    assert row_columns(bookkeeper, "shop.orders") == {"id": "int", "qty": "int", "note": "string"}
    assert row_columns(bookkeeper, "shop.customers") == {
        "id": "int",
        "qty": "string",
        "name": "string",
    }
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
    assert orders == [{"id": i, "qty": i * 10, "note": f"n{i}"} for i in range(20)]
    assert customers == [{"id": i, "qty": f"q{i}", "name": f"c{i}"} for i in range(30)]


def test_an_alter_on_one_table_leaves_the_other_tables_schema_alone(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    orders_topic, customers_topic = f"{unique_topic}.orders", f"{unique_topic}.customers"
    config = two_table_config(tmp_path, orders_topic, customers_topic, by_source_table=False)
    for topic in (orders_topic, customers_topic):
        ensure_topic(config.sources[0].bootstrap_servers, topic, 1)
    produce_creates(
        config, orders_topic, shape("s", "orders", ORDERS), [{"id": 1, "qty": 1, "note": "a"}]
    )
    produce_creates(
        config,
        customers_topic,
        shape("s", "customers", CUSTOMERS),
        [{"id": 1, "qty": "x", "name": "b"}],
    )
    job = WriterJob(
        config, spark=spark
    )  # one writer throughout: its guess from the first batch must miss
    run_pipeline(config, spark, job)
    altered = (*CUSTOMERS, Column("email", "string"))
    produce_creates(
        config,
        customers_topic,
        shape("s", "customers", altered),
        [{"id": 2, "qty": "y", "name": "c", "email": "c@example.com"}],
    )
    produce_creates(
        config, orders_topic, shape("s", "orders", ORDERS), [{"id": 2, "qty": 2, "note": "d"}]
    )

    bookkeeper = run_pipeline(config, spark, job)

    assert row_columns(bookkeeper, "shop.customers") == {
        "id": "int",
        "qty": "string",
        "name": "string",
        "email": "string",
    }
    assert row_columns(bookkeeper, "shop.orders") == {"id": "int", "qty": "int", "note": "string"}


@pytest.mark.parametrize("allow_drop", [True, False], ids=["drop-allowed", "drop-not-allowed"])
def test_a_column_the_source_dropped_is_dropped_or_kept_null_as_configured(
    local_stack, spark, tmp_path: Path, unique_topic: str, allow_drop: bool
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__BOOKKEEPER__ALLOW_DROP_COLUMNS": str(allow_drop).lower(),
        },
    )
    ensure_topic(config.sources[0].bootstrap_servers, unique_topic, 1)
    produce_creates(
        config,
        unique_topic,
        shape("s", "orders", ORDERS),
        [{"id": 1, "qty": 1, "note": "before the drop"}],
    )
    job = WriterJob(config, spark=spark)
    run_pipeline(config, spark, job)
    dropped = tuple(c for c in ORDERS if c.name != "note")
    produce_creates(config, unique_topic, shape("s", "orders", dropped), [{"id": 2, "qty": 2}])

    bookkeeper = run_pipeline(config, spark, job)

    table = bookkeeper.catalog.load_table("shop.orders")
    if allow_drop:
        assert row_columns(bookkeeper, "shop.orders") == {"id": "int", "qty": "int"}
        assert table.scan(selected_fields=("id", "qty")).to_arrow().sort_by("id").to_pylist() == [
            {"id": 1, "qty": 1},
            {"id": 2, "qty": 2},
        ]
    else:
        assert row_columns(bookkeeper, "shop.orders") == {
            "id": "int",
            "qty": "int",
            "note": "string",
        }
        rows = table.scan(selected_fields=("id", "note")).to_arrow().sort_by("id").to_pylist()
        assert rows == [{"id": 1, "note": "before the drop"}, {"id": 2, "note": None}]


LEGACY = (
    Column("id", "int", optional=False),
    Column("qty", "int"),
    Column("legacy_code", "string"),
    Column("note", "string"),
)


@pytest.mark.parametrize("engine", ["arrow", "spark-sql"])
def test_a_column_added_after_a_drop_never_reads_the_dropped_columns_values(
    local_stack, spark, tmp_path: Path, unique_topic: str, engine: str
) -> None:
    """Issue 26 item 3, seen on MariaDB -> Debezium with `allow_drop_columns`: after DROP COLUMN
    legacy_code, DROP COLUMN note, ADD COLUMN promo, old rows read their `legacy_code` values
    (`L-49316`) as `promo`: the writer numbered promo from the current schema's highest id, which
    gave it legacy_code's. promo is a new column: null in every row from before it."""
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__BOOKKEEPER__ALLOW_DROP_COLUMNS": "true",
            "ICEKEEPER__WRITER__ENGINE": engine,
        },
    )
    ensure_topic(config.sources[0].bootstrap_servers, unique_topic, 1)
    job = WriterJob(config, spark=spark)
    produce_creates(
        config,
        unique_topic,
        shape("s", "orders", LEGACY),
        [{"id": i, "qty": i, "legacy_code": f"L-4931{i}", "note": f"n{i}"} for i in (1, 2, 3)],
    )
    run_pipeline(config, spark, job)
    dropped = tuple(c for c in LEGACY if c.name not in ("legacy_code", "note"))
    produce_creates(
        config, unique_topic, shape("s", "orders", dropped), [{"id": i, "qty": i} for i in (4, 5)]
    )
    run_pipeline(config, spark, job)
    added = (*dropped, Column("promo", "string"))
    produce_creates(
        config,
        unique_topic,
        shape("s", "orders", added),
        [{"id": i, "qty": i, "promo": f"P-{i}"} for i in (6, 7)],
    )

    bookkeeper = run_pipeline(config, spark, job)

    table = bookkeeper.catalog.load_table("shop.orders")
    assert row_columns(bookkeeper, "shop.orders") == {"id": "int", "qty": "int", "promo": "string"}
    expected = [{"id": i, "promo": None} for i in range(1, 6)] + [
        {"id": i, "promo": f"P-{i}"} for i in (6, 7)
    ]
    read = {
        "pyiceberg": table.scan(selected_fields=("id", "promo"))
        .to_arrow()
        .sort_by("id")
        .to_pylist(),
        "spark": spark_rows(spark, config, "shop.orders", "id, promo", order_by="id"),
        "duckdb": duckdb_rows(table, "id, promo", order_by="id"),
    }
    assert read == {reader: expected for reader in read}
    # An id no schema of the table ever had.
    given_out = max(schema.highest_field_id for schema in table.metadata.schemas[:-1])
    promo_id = table.schema().find_field("promo").field_id
    assert promo_id == given_out + 1 == table.metadata.last_column_id


def test_a_batch_that_gives_a_table_no_rows_is_not_read_again_for_it(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    # Found against a real MariaDB: a batch with rows for one table only, or only Debezium's
    # tombstones, published nothing for the other table, and the writer read it again forever.
    orders_topic, customers_topic = f"{unique_topic}.orders", f"{unique_topic}.customers"
    config = two_table_config(tmp_path, orders_topic, customers_topic, by_source_table=False)
    for topic in (orders_topic, customers_topic):
        ensure_topic(config.sources[0].bootstrap_servers, topic, 1)
    job = WriterJob(config, spark=spark)
    produce_creates(
        config,
        customers_topic,
        shape("s", "customers", CUSTOMERS),
        [{"id": 6, "qty": "q", "name": "c"}],
    )
    produce_creates(
        config, orders_topic, shape("s", "orders", ORDERS), [{"id": 0, "qty": 0, "note": "o"}]
    )
    start = job.run(max_batches=4, until_idle=True)  # both tables have progress of their own now
    produce_creates(
        config,
        orders_topic,
        shape("s", "orders", ORDERS),
        [{"id": i, "qty": i, "note": "o"} for i in range(1, 5)],
    )
    first = job.run(max_batches=4, until_idle=True)
    producer = Producer({"bootstrap.servers": config.sources[0].bootstrap_servers})
    producer.produce(
        customers_topic, key=b'{"id": 1}', value=None, partition=0
    )  # a tombstone alone
    producer.flush()
    second = job.run(max_batches=4, until_idle=True)
    produce_creates(
        config,
        customers_topic,
        shape("s", "customers", CUSTOMERS),
        [{"id": 7, "qty": "q", "name": "c"}],
    )
    third = job.run(max_batches=4, until_idle=True)

    assert [sum(r.records_read for r in reports) for reports in (start, first, second, third)] == [
        2,
        4,
        1,
        1,
    ]
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    assert bookkeeper.catalog.load_table("shop.orders").scan().to_arrow().num_rows == 5
    assert bookkeeper.catalog.load_table("shop.customers").scan(
        selected_fields=("id",)
    ).to_arrow().sort_by("id").to_pylist() == [{"id": 6}, {"id": 7}]
