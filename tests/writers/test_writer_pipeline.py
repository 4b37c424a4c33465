"""The writer against real Kafka, registry and Spark, checked as a user would check the result.

Each test produces to a topic of its own, runs a `WriterJob` on the shared local SparkSession,
and looks at what a user looks at: the Parquet files, the monikers, the dead-letter topic, and
the Iceberg table once the bookkeeper committed the monikers.
"""

from __future__ import annotations

import collections
import datetime
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.readers import duckdb_rows
from icekeeper.samples.produce import produce_seed_sample, produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec, expected_state, synthetic_events
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import (
    commit_all,
    pipeline_config,
    register_catalog,
    table_rows,
    topic_values_with_headers,
)
from tests.support.seed000 import ARTICLE_RESULT

pytestmark = [pytest.mark.integration, pytest.mark.spark]
SEED_TABLE = "db_gb18030_test.tbl_test_1"


AUDIT_TABLE = "db_gb18030_test.tbl_test_1_audit"


def test_seed_sample_becomes_the_articles_table(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """Seed 000's stream through one topic into two tables (fan-out): the primary-key table mirrors
    the source (the article's five rows, one per key, no read-time trick) and an audit table in
    `changelog` mode keeps all 26 changes."""
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__TABLES__1__IDENTIFIER": AUDIT_TABLE,
            "ICEKEEPER__TABLES__1__TOPICS": f"[{unique_topic}]",
            "ICEKEEPER__TABLES__1__MODE": "changelog",
        },
    )
    assert config.tables[0].upsert and not config.tables[1].upsert
    produce_seed_sample(config, topic=unique_topic, progress=lambda m: None)
    job = WriterJob(config, spark=spark)
    reports = job.run(until_idle=True)
    assert sum(r.records_read for r in reports) == 26

    monikers = {m.table: m for m in job.transport.pending()}
    moniker = monikers[AUDIT_TABLE]
    assert moniker.writer_id == "writer-1" and moniker.prev_seq is None
    assert sorted((o.partition, o.from_offset, o.until_offset) for o in moniker.offsets) == [
        (0, 0, 4),
        (1, 0, 4),
        (2, 0, 18),
    ]
    assert (
        moniker.records == 26
        and moniker.min_event_time_ms == 1646101923000
        and moniker.max_event_time_ms == 1646392418000
    )
    # The mirror's batch: one row per key (the last change of each), nothing deleted in the sample.
    assert monikers[SEED_TABLE].records == 5 and not monikers[SEED_TABLE].delete_files
    # Files: zstd, microsecond timestamps, Iceberg field ids that match the moniker's schema.
    schema_ids = {field["name"]: field["id"] for field in moniker.schema_["fields"]}
    for entry in moniker.files:
        path = entry.path.removeprefix("file://")
        assert path.startswith(moniker.table_location.removeprefix("file://") + "/data/")
        parquet = pq.ParquetFile(path)
        assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
        arrow = parquet.schema_arrow
        assert {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in arrow} == schema_ids
        assert str(arrow.field("_kfk_timestamp").type) == "timestamp[us, tz=UTC]"

    bookkeeper = commit_all(config)
    changes = table_rows(bookkeeper, AUDIT_TABLE)
    assert len(changes) == 26
    first = next(r for r in changes if r["_kfk_partition"] == 0 and r["_kfk_offset"] == 0)
    assert (
        first["_src_op"],
        first["_src_ts_ms"],
        first["_src_ts_ms_r"],
        first["_src_pos"],
        first["_tsc_id"],
    ) == ("c", 1646297167000, 1646297167652, 46951, "e45b718e-906f-11ec-89e3-0242c0a8640a:1375")
    rows = table_rows(bookkeeper, SEED_TABLE)
    assert sorted(row["ID1"] for row in rows) == sorted(ARTICLE_RESULT)
    for row in rows:
        (c2, c3, c4, c5, c6, update_time), (partition, offset) = ARTICLE_RESULT[row["ID1"]]
        # Debezium's io.debezium.time.Timestamp (millis of
        # a DATETIME's wall clock) lands as a timestamp.
        wall_clock = datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=update_time)
        assert (row["C2"], row["C3"], row["C4"], row["C5"], row["C6"], row["UPDATE_TIME"]) == (
            c2,
            c3,
            c4,
            c5,
            c6,
            wall_clock,
        )
        assert (row["_kfk_partition"], row["_kfk_offset"]) == (partition, offset)
        assert (
            row["_src_db"] == "db_gb18030_test"
            and row["_src_table"] == "tbl_test_1"
            and row["_kfk_topic"] == unique_topic
        )
    # Spark's Iceberg reader and DuckDB, on the same catalog, see the same five rows.
    catalog = register_catalog(spark, config)
    expected = {"n": 5, "c2": sum(r["C2"] for r in rows)}
    assert (
        spark.sql(f"SELECT count(*) AS n, sum(C2) AS c2 FROM {catalog}.{SEED_TABLE}")
        .collect()[0]
        .asDict()
        == expected
    )
    assert (
        duckdb_rows(bookkeeper.catalog.load_table(SEED_TABLE), "count(*) AS n, sum(C2) AS c2")[0]
        == expected
    )


def test_poison_goes_to_the_dead_letter_topic_and_counts_reconcile(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    dead_letter_topic = unique_topic + ".dlq"
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": dead_letter_topic,
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
        },
    )
    spec = SyntheticSpec(seed=11, keys=300, events=4000, schema_changes=2, poison_ratio=0.02)
    produced = produce_synthetic(
        config, spec, topic=unique_topic, partitions=3, progress=lambda m: None
    )
    reports = WriterJob(config, spark=spark).run(until_idle=True)
    records_in = sum(r.records_read for r in reports)
    assert records_in == produced["records"]
    assert sum(r.rows_written for r in reports) == spec.events
    assert sum(r.dead_lettered for r in reports) == sum(produced["poison"].values())

    dead = topic_values_with_headers(config, dead_letter_topic)
    reasons = collections.Counter(headers["icekeeper.reason"] for _, headers in dead)
    assert reasons == {
        "bad-magic-byte": produced["poison"]["bad-magic-byte"],
        "unknown-schema-id": produced["poison"]["unknown-schema-id"],
        "undecodable-avro": produced["poison"]["truncated-avro"],
    }
    # Each dead letter names its source record, and the raw value is kept.
    positions = {(h["icekeeper.source.partition"], h["icekeeper.source.offset"]) for _, h in dead}
    assert len(positions) == len(dead)

    bookkeeper = commit_all(config)
    rows = table_rows(bookkeeper, "shop.orders")
    assert len(rows) + len(dead) == records_in
    # Schema changes mid-stream: the added column exists and `amount` was widened to long.
    table = bookkeeper.catalog.load_table("shop.orders")
    assert str(table.schema().find_field("amount").field_type) == "long"
    assert {"extra_1"} <= {f.name for f in table.schema().fields}
    good = [e for e in synthetic_events(spec) if e.poison is None]
    assert sorted((r["_kfk_partition"], r["_kfk_offset"]) for r in rows) == sorted(
        set((r["_kfk_partition"], r["_kfk_offset"]) for r in rows)
    )
    assert collections.Counter(r["_src_op"] for r in rows) == collections.Counter(
        e.op for e in good
    )


def test_a_schema_registered_under_another_subject_is_decoded_not_dead_lettered(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    dead_letter_topic = unique_topic + ".dlq"
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": dead_letter_topic,
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
        },
    )
    first = produce_synthetic(
        config,
        SyntheticSpec(seed=31, keys=100, events=600, schema_changes=0),
        topic=unique_topic,
        progress=lambda m: None,
    )
    # Version 2 of the schema is registered only under another subject (not `<topic>-value`):
    # the writer finds it by the id its records name.
    later = produce_synthetic(
        config,
        SyntheticSpec(seed=32, keys=100, events=600, schema_changes=1),
        topic=unique_topic,
        progress=lambda m: None,
        subject=unique_topic + ".elsewhere",
    )
    reports = WriterJob(config, spark=spark).run(until_idle=True)
    assert sum(r.records_read for r in reports) == first["records"] + later["records"]
    assert sum(r.dead_lettered for r in reports) == 0
    rows = table_rows(commit_all(config), "shop.orders")
    assert len(rows) == first["events"] + later["events"]
    assert {"extra_1"} <= set(rows[0])


def test_a_restarted_writer_neither_skips_nor_repeats(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "700",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
        },
    )
    spec = SyntheticSpec(seed=5, keys=100, events=3000, schema_changes=0)
    produce_synthetic(config, spec, topic=unique_topic, partitions=3, progress=lambda m: None)
    WriterJob(config, spark=spark).run(max_batches=2)  # then "crash": two monikers stay pending
    Bookkeeper(config).run_cycle()  # the first ones get committed meanwhile
    restarted = WriterJob(config, spark=spark)
    restarted.run(until_idle=True)
    bookkeeper = commit_all(config)
    rows = table_rows(bookkeeper, "shop.orders")
    positions = [(r["_kfk_partition"], r["_kfk_offset"]) for r in rows]
    assert len(positions) == len(set(positions)) == 3000
    state = expected_state(spec)
    final = {}
    for row in sorted(rows, key=lambda r: r["_src_ts_ms"]):
        final[row["id"]] = row if row["_src_op"] != "d" else None
    assert {k: (v["amount"] if v else None) for k, v in final.items()} == {
        k: (v["amount"] if v else None) for k, v in state.items()
    }
    assert restarted.tables["shop.orders"].last_seq >= 3


@pytest.mark.parametrize("with_schema", [True, False])
def test_debezium_json_with_and_without_the_schema_envelope(
    local_stack, spark, tmp_path: Path, unique_topic: str, with_schema: bool
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__FORMAT": "debezium-json",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
        },
    )
    events = [
        e for e in synthetic_events(SyntheticSpec(seed=2, keys=20, events=200, schema_changes=0))
    ]
    from confluent_kafka import Producer

    from icekeeper.samples.produce import ensure_topic

    ensure_topic(config.sources[0].bootstrap_servers, unique_topic, 1)
    producer = Producer({"bootstrap.servers": config.sources[0].bootstrap_servers})
    for event in events:
        value = (
            {"schema": {"type": "struct", "name": "envelope"}, "payload": event.value}
            if with_schema
            else event.value
        )
        producer.produce(unique_topic, key=json.dumps(event.key), value=json.dumps(value))
    producer.produce(unique_topic, key=b"x", value=b"{not json")
    producer.flush()
    reports = WriterJob(config, spark=spark).run(until_idle=True)
    assert (
        sum(r.rows_written for r in reports) == 200 and sum(r.dead_lettered for r in reports) == 1
    )
    rows = table_rows(commit_all(config), "shop.orders")
    assert sorted(r["_kfk_offset"] for r in rows) == list(range(200))
    assert {r["_src_op"] for r in rows} == {e.op for e in events}
    by_offset = {r["_kfk_offset"]: r for r in rows}
    for offset, event in enumerate(events):
        row_values = event.value["after"] or event.value["before"]
        assert (
            by_offset[offset]["customer"] == row_values["customer"]
            and by_offset[offset]["id"] == row_values["id"]
        )
