"""`format: debezium-unwrapped-avro` (issue 27, item 2): Debezium's `ExtractNewRecordState` output.

Inserts, an update in a later batch, a delete written as its row with `__deleted: "true"` (and
the tombstone after it), and a key deleted in the same batch it was created in, into an upsert
table with hard deletes, through real writer batches and bookkeeper commits, with
`writer.engine: spark-sql` and `arrow` (which registers no decoder for the format: the core runs
those batches on `spark-sql`). The table ends holding the live keys' last rows; the op and
event-time metadata columns come from `__op` and `__source_ts_ms`. A record without `__op` (an
SMT configured without `add.fields`) still deletes by `__deleted`.

A source column whose name starts with `__` stays a column: one that is none the SMT adds
(`__tag`), and one that is (`__table`) but comes before the row's last column (the SMT appends
its fields), which neither routes the row nor leaves it.
Records that cannot say they are deletes (no `__deleted`: the SMT's delete defaults, with or
without `add.fields: op`) into an upsert table (hard or soft deletes) leave the deleted key live,
and the writer warns once, naming the connector settings and the upsert tables the topic feeds.
A truncated record becomes an `undecodable-avro` dead letter, not a row of nulls (plain
`avro-confluent` too, on both engines), also when its body starts with the bytes of another
version's record of nulls. A date before 1582 is read as it is on `spark-sql`, whatever
`spark.conf` sets Spark's Avro rebase mode to.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path

import pytest
from confluent_kafka import Producer

from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.config.model import KafkaSource
from icekeeper.common.kafka_clients import registry_client
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import commit_all, pipeline_config, table_rows
from tests.writers.test_upsert_record_keys import dead_letter_reasons, run_batches

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROW_FIELDS = [
    {"name": "id", "type": "int"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "long"},
]
WITH_ADDED_FIELDS = {
    "type": "record",
    "name": "Value",
    "namespace": "shop.public.orders",
    "fields": [
        *ROW_FIELDS,
        {"name": "__op", "type": ["null", "string"], "default": None},
        {"name": "__source_ts_ms", "type": ["null", "long"], "default": None},
        {"name": "__deleted", "type": ["null", "string"], "default": None},
    ],
}
DELETED_ONLY = {**WITH_ADDED_FIELDS, "fields": [*ROW_FIELDS, WITH_ADDED_FIELDS["fields"][-1]]}
"""`ExtractNewRecordState` with `delete.handling.mode: rewrite` and no `add.fields`."""


def change(key: int, customer: str, amount: int, op: str, ts: int) -> dict:
    return {
        "id": key,
        "customer": customer,
        "amount": amount,
        "__op": op,
        "__source_ts_ms": ts,
        "__deleted": "true" if op == "d" else "false",
    }


@pytest.mark.parametrize("engine", ["spark-sql", "arrow"])
def test_unwrapped_debezium_changes_leave_the_live_rows_of_an_upsert_table(
    local_stack, spark, tmp_path: Path, unique_topic: str, engine: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__FORMAT": "debezium-unwrapped-avro",
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "4",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__WRITER__ENGINE": engine,
        },
    )
    source = config.sources[0]
    ensure_topic(source, unique_topic, 1)
    framer = ConfluentAvroFramer(registry_client(source), unique_topic)
    full, deleted_only = (
        framer.schema_id(WITH_ADDED_FIELDS, is_key=False),
        framer.schema_id(DELETED_ONLY, is_key=False),
    )
    records: list[bytes | None] = [
        # batch 1
        framer.frame(full, change(1, "ada", 10, "c", 1_000)),
        framer.frame(full, change(2, "bob", 20, "c", 2_000)),
        framer.frame(full, change(3, "cyd", 30, "c", 3_000)),
        framer.frame(full, change(4, "dan", 40, "c", 4_000)),
        # batch 2: an update, a delete and its tombstone, a key created and deleted at once
        framer.frame(full, change(2, "bob", 21, "u", 5_000)),
        framer.frame(full, change(1, "ada", 10, "d", 6_000)),
        None,
        framer.frame(full, change(5, "eve", 50, "c", 7_000)),
        # batch 3
        framer.frame(full, change(5, "eve", 50, "d", 8_000)),
        framer.frame(deleted_only, {"id": 3, "customer": "cyd", "amount": 30, "__deleted": "true"}),
        framer.frame(
            deleted_only, {"id": 4, "customer": "dan", "amount": 41, "__deleted": "false"}
        ),
    ]
    producer = Producer({"bootstrap.servers": source.bootstrap_servers})
    for value in records:
        producer.produce(unique_topic, value=value, key=b"k", partition=0)
    assert producer.flush(30) == 0

    reports, bookkeeper = run_batches(config, spark)

    assert sum(report.records_read for report in reports) == len(records)
    rows = {
        row["id"]: row
        for row in bookkeeper.catalog.load_table("shop.orders").scan().to_arrow().to_pylist()
    }
    assert {key: (r["customer"], r["amount"]) for key, r in rows.items()} == {
        2: ("bob", 21),
        4: ("dan", 41),
    }
    assert rows[2]["_src_op"] == "u"
    assert rows[2]["_src_ts_ms"] == 5_000
    assert rows[4]["_src_op"] == "u"  # no `__op`: not a delete, kind unknown
    assert not any(name.startswith("__") for name in rows[2]), "added fields are no row columns"


def _unique(schema: dict, topic: str) -> dict:
    """`schema` in a namespace of its own: the registry gives an identical schema the same id
    in every test, and the writer warns once per schema id and process."""
    return {**schema, "namespace": "test.t" + topic.removeprefix("test.")}


def _produce(bootstrap: str, topic: str, records: list[bytes | None]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in records:
        producer.produce(topic, value=value, key=b"k", partition=0)
    assert producer.flush(30) == 0


def test_a_source_column_starting_with_two_underscores_stays_a_column(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__FORMAT": "debezium-unwrapped-avro",
            # Claims the records whose `source.table` is "decoy", before the table of the topic:
            # a row column `__table` must not be read as the SMT's (review s8b R5).
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.decoy",
            "ICEKEEPER__TABLES__0__SOURCE_TABLE": "decoy",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__1__IDENTIFIER": "shop.tagged",
            "ICEKEEPER__TABLES__1__TOPICS": f"[{unique_topic}]",
            "ICEKEEPER__TABLES__1__PRIMARY_KEY": "[id]",
        },
    )
    source = config.sources[0]
    ensure_topic(source, unique_topic, 1)
    framer = ConfluentAvroFramer(registry_client(source), unique_topic)
    schema = framer.schema_id(
        {
            **WITH_ADDED_FIELDS,
            "fields": [
                *ROW_FIELDS[:1],
                # Row columns with names the SMT could give (`__table`) or not (`__tag`): the
                # SMT appends its own after the row's last column.
                {"name": "__table", "type": ["null", "string"], "default": None},
                {"name": "__tag", "type": ["null", "string"], "default": None},
                *ROW_FIELDS[1:],
                *WITH_ADDED_FIELDS["fields"][len(ROW_FIELDS) :],
                {"name": "__lsn", "type": ["null", "long"], "default": None},
            ],
        },
        is_key=False,
    )
    _produce(
        source.bootstrap_servers,
        unique_topic,
        [
            framer.frame(
                schema,
                {
                    **change(1, "ada", 10, "c", 1_000),
                    "__tag": "red",
                    "__table": "decoy",
                    "__lsn": 7,
                },
            ),
            framer.frame(
                schema,
                {**change(2, "bob", 20, "c", 2_000), "__tag": None, "__table": None, "__lsn": 8},
            ),
        ],
    )

    WriterJob(config, spark=spark).run(until_idle=True)
    rows = table_rows(commit_all(config), "shop.tagged")

    columns = ("__tag", "__table")
    assert {row["id"]: tuple(row.get(c, f"no {c} column") for c in columns) for row in rows} == {
        1: ("red", "decoy"),
        2: (None, None),
    }
    added = {"__op", "__source_ts_ms", "__deleted", "__lsn"}
    assert not added & set(rows[0]), "the fields the SMT adds are no row columns"


@pytest.mark.parametrize(
    ("with_op", "delete_mode"),
    [(False, "hard"), (True, "hard"), (False, "soft")],
    ids=["defaults", "add.fields=op", "soft-deletes"],
)
def test_deletes_the_records_cannot_show_are_warned_about_once(
    local_stack,
    spark,
    tmp_path: Path,
    unique_topic: str,
    caplog: pytest.LogCaptureFixture,
    with_op: bool,
    delete_mode: str,
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__FORMAT": "debezium-unwrapped-avro",
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "2",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.mirror",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__DELETE_MODE": delete_mode,
            # An upsert table of the source fed by another topic: not named in the warning.
            "ICEKEEPER__TABLES__1__IDENTIFIER": "shop.elsewhere",
            "ICEKEEPER__TABLES__1__TOPICS": f"[{unique_topic}.elsewhere]",
            "ICEKEEPER__TABLES__1__PRIMARY_KEY": "[id]",
        },
    )
    source = config.sources[0]
    ensure_topic(source, unique_topic, 1)
    framer = ConfluentAvroFramer(registry_client(source), unique_topic)
    # `ExtractNewRecordState` with its delete defaults: the row alone, and `__op` with
    # `add.fields: op` (never "d": a delete is a tombstone).
    op_field = WITH_ADDED_FIELDS["fields"][len(ROW_FIELDS)]
    fields = [*ROW_FIELDS, op_field] if with_op else ROW_FIELDS
    row_only = framer.schema_id(
        _unique({**WITH_ADDED_FIELDS, "fields": fields}, unique_topic), False
    )

    def row(key: int, customer: str, amount: int, op: str) -> bytes:
        values = {"id": key, "customer": customer, "amount": amount}
        return framer.frame(row_only, {**values, "__op": op} if with_op else values)

    records = [
        row(1, "ada", 10, "c"),
        row(2, "bob", 20, "c"),
        None,  # the delete of key 1, as the SMT's defaults leave it
        row(3, "cyd", 30, "c"),
    ]
    _produce(source.bootstrap_servers, unique_topic, records)

    logger = "icekeeper.writers.spark_sql_engine.sql_unwrapped_avro"
    with caplog.at_level(logging.WARNING, logger=logger):
        reports, bookkeeper = run_batches(config, spark)

    assert len(reports) >= 2
    assert sum(r.records_read for r in reports) == len(records)
    rows = bookkeeper.catalog.load_table("shop.mirror").scan().to_arrow().to_pylist()
    assert sorted(row["id"] for row in rows) == [1, 2, 3], "a tombstone deletes nothing"
    warnings = [r for r in caplog.records if r.name == logger and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    [warning] = warnings
    assert "delete.tombstone.handling.mode" in warning.getMessage()
    assert "delete.handling.mode" in warning.getMessage()
    assert (warning.source, warning.schema_id, warning.tables) == (
        source.name,
        row_only,
        ["shop.mirror"],
    )


NULLABLE = {
    "type": "record",
    "name": "Value",
    "fields": [
        {"name": "id", "type": ["null", "int"], "default": None},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
"""Every field may be null: a record of nulls is a row; a truncated one must not pass for it."""
REQUIRED = {
    **NULLABLE,
    "fields": [{"name": "id", "type": "int"}, {"name": "note", "type": "string"}],
}
"""Fields that cannot be null: a truncated record decodes to nulls none of its records has."""


def _notes_pipeline(
    tmp_path: Path, topic: str, source_format: str, engine: str
) -> tuple[IcekeeperConfig, KafkaSource, ConfluentAvroFramer]:
    """A changelog table without a primary key fed by `topic` in `source_format` on `engine`,
    with a dead-letter topic; the topic made, and a framer for its value schemas."""
    config = pipeline_config(
        tmp_path,
        topic,
        {
            "ICEKEEPER__SOURCES__0__FORMAT": source_format,
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": f"{topic}.dlq",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.notes",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            "ICEKEEPER__WRITER__ENGINE": engine,
        },
    )
    source = config.sources[0]
    ensure_topic(source, topic, 1)
    return config, source, ConfluentAvroFramer(registry_client(source), topic)


TRUNCATION_CASES = [
    ("debezium-unwrapped-avro", "spark-sql"),
    ("avro-confluent", "spark-sql"),
    ("avro-confluent", "arrow"),
]
"""Where a truncated body may pass for a row of nulls: Spark's from_avro on both Avro formats;
arrow (fastavro rejects it) for parity."""


@pytest.mark.parametrize(("source_format", "engine"), TRUNCATION_CASES)
def test_a_truncated_record_is_dead_lettered_not_a_row_of_nulls(
    local_stack, spark, tmp_path: Path, unique_topic: str, source_format: str, engine: str
) -> None:
    config, source, framer = _notes_pipeline(tmp_path, unique_topic, source_format, engine)
    nullable, required = (framer.schema_id(s, is_key=False) for s in (NULLABLE, REQUIRED))

    def half(schema_id: int) -> bytes:
        """The frame and half the body of a record."""
        whole = framer.frame(schema_id, {"id": 9, "note": "a note long enough to cut in half"})
        return whole[: 5 + (len(whole) - 5) // 2]

    records = [
        framer.frame(nullable, {"id": 1, "note": "first"}),
        framer.frame(nullable, {"id": None, "note": None}),  # a row of nulls, as written
        half(nullable),
        framer.frame(required, {"id": 3, "note": "required"}),
        half(required),
        framer.frame(nullable, {"id": 5, "note": "last"}),
    ]
    _produce(source.bootstrap_servers, unique_topic, records)

    reports = WriterJob(config, spark=spark).run(until_idle=True)
    rows = table_rows(commit_all(config), "shop.notes")

    rows.sort(key=lambda row: row["_kfk_offset"])
    assert [(row["_kfk_offset"], row["id"], row["note"]) for row in rows] == [
        (0, 1, "first"),
        (1, None, None),
        (3, 3, "required"),
        (5, 5, "last"),
    ]
    assert dead_letter_reasons(config, source.dead_letter_topic) == ["undecodable-avro"] * 2
    assert sum(r.records_read for r in reports) == len(records)
    assert sum(r.rows_written for r in reports) == 4
    assert sum(r.dead_lettered for r in reports) == 2


ONE_NULLABLE = {**NULLABLE, "fields": NULLABLE["fields"][:1]}
"""One field that may be null: a record of nulls is the one byte 0x00, as is an int 0."""


@pytest.mark.parametrize(("source_format", "engine"), TRUNCATION_CASES)
def test_a_truncated_record_does_not_pass_for_another_versions_row_of_nulls(
    local_stack, spark, tmp_path: Path, unique_topic: str, source_format: str, engine: str
) -> None:
    """Review s8b R1: each version's all-null byte test holds for its own records only."""
    config, source, framer = _notes_pipeline(tmp_path, unique_topic, source_format, engine)
    one, required = (framer.schema_id(s, is_key=False) for s in (ONE_NULLABLE, REQUIRED))
    # id 0 encodes as 0x00: the body starts with ONE_NULLABLE's record of nulls.
    whole = framer.frame(required, {"id": 0, "note": "a note long enough to cut in half"})
    records = [
        framer.frame(one, {"id": 1}),
        whole[: 5 + (len(whole) - 5) // 2],
        framer.frame(required, {"id": 3, "note": "required"}),
    ]
    _produce(source.bootstrap_servers, unique_topic, records)

    reports = WriterJob(config, spark=spark).run(until_idle=True)
    rows = table_rows(commit_all(config), "shop.notes")

    rows.sort(key=lambda row: row["_kfk_offset"])
    assert [(row["_kfk_offset"], row["id"], row.get("note")) for row in rows] == [
        (0, 1, None),
        (2, 3, "required"),
    ]
    assert dead_letter_reasons(config, source.dead_letter_topic) == ["undecodable-avro"]
    assert sum(r.dead_lettered for r in reports) == 1


REBASE_IN_READ = "spark.sql.avro.datetimeRebaseModeInRead"


def test_a_date_before_1582_is_read_as_it_is_whatever_spark_conf_says(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """Review s8b R4: the writer's session reads Avro dates proleptic Gregorian (as Iceberg
    stores them, and the arrow engine reads them), over a `spark.conf` that says otherwise."""
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": f"{unique_topic}.dlq",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.dated",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            "ICEKEEPER__WRITER__ENGINE": "spark-sql",  # arrow decodes without Spark's settings
        },
    )
    config.spark.conf[REBASE_IN_READ] = "EXCEPTION"
    source = config.sources[0]
    ensure_topic(source, unique_topic, 1)
    framer = ConfluentAvroFramer(registry_client(source), unique_topic)
    dated = framer.schema_id(
        {
            "type": "record",
            "name": "Dated",
            "fields": [
                {"name": "id", "type": "int"},
                {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            ],
        },
        is_key=False,
    )
    days = [datetime.date(1, 1, 1), datetime.date(1000, 6, 15), datetime.date(2024, 2, 29)]
    _produce(
        source.bootstrap_servers,
        unique_topic,
        [framer.frame(dated, {"id": i, "day": day}) for i, day in enumerate(days)],
    )

    before = dict(spark.conf.getAll)
    try:
        # Without `spark=`, the writer builds its session from `config` (the tests' one, reused).
        WriterJob(config).run(until_idle=True)
        assert spark.conf.get(REBASE_IN_READ) == "CORRECTED"
    finally:
        # Back to the shared session's settings (the writer's applied its own over them).
        after = dict(spark.conf.getAll)
        for key in after.keys() - before.keys():
            if spark.conf.isModifiable(key):
                spark.conf.unset(key)
        for key, value in before.items():
            if after.get(key) != value and spark.conf.isModifiable(key):
                spark.conf.set(key, value)
    rows = table_rows(commit_all(config), "shop.dated")

    assert sorted((row["id"], row["day"]) for row in rows) == list(enumerate(days))
    assert dead_letter_reasons(config, source.dead_letter_topic) == []
