"""`writer.engine: arrow` writes the same upsert tables as `spark-sql` from the same Kafka input
(issue 15, item 6): inserts, repeated updates within and across batches, hard and soft deletes
(one topic feeding a table of each), a change of primary key, a delete without a `before` image,
and poison records; compared through pyiceberg after the bookkeeper's commits, with the dead
letters. A batch over more Kafka partitions than cores runs whole partitions in one arrow task
per core. And a key in two Kafka partitions of one batch, in two arrow tasks or in two ranges of
one task, ends as `spark-sql` orders it."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.kafka_clients import registry_client
from icekeeper.samples.debezium import BinlogPosition, envelope
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic
from icekeeper.samples.readback import topic_messages
from tests.support.pipeline import pipeline_config
from tests.writers.test_upsert_record_keys import ORDERS, Stream, order, run_batches

# Two writers and two bookkeepers over five batches each, plus the dead-letter passes.
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.heavy]
KEEP_WRITTEN_FILES = {"ICEKEEPER__BOOKKEEPER__PURGE_DELETED_SHARE": "0"}
"""The tests compare the files each engine wrote: the bookkeeper's purges (`bookkeeper/purges.py`)
would replace mostly-deleted ones with files of their own."""

SIZE = 6
"""Records per batch."""
TABLES = ("shop.orders", "shop.orders_soft")


def _stream() -> Stream:
    stream, rows = Stream(ORDERS), {key: order(key, "eu", key * 10) for key in range(1, 11)}
    for key in (1, 2, 3, 4, 5, 8):
        stream.create(rows[key])
    stream.batch(SIZE)
    stream.update(rows[2], order(2, "eu", 21))
    stream.update(order(2, "eu", 21), order(2, "eu", 22, "paid"))  # twice in one batch
    stream.update(rows[3], order(3, "eu", 31))
    stream.delete(rows[1])
    stream.create(rows[6])
    stream.update(rows[6], order(6, "eu", 61))
    stream.batch(SIZE)
    stream.delete(rows[4])  # primary key 4 -> 44: delete + create
    stream.tombstone(rows[4])
    stream.create(order(44, "eu", 40))
    stream.update(order(2, "eu", 22, "paid"), order(2, "eu", 23, "sent"))  # across batches
    stream.delete(order(6, "eu", 61))
    stream.create(rows[7])
    stream.batch(SIZE)
    # The key schema is not known yet: `spark-sql` writes this batch, learns it from the dead
    # letter and the batch is written again, by the arrow engine, which reads the key.
    stream.delete(rows[8], before_image=False)
    stream.tombstone(rows[8])
    stream.create(rows[10])
    stream.update(rows[10], order(10, "eu", 101))
    stream.update(rows[5], order(5, "eu", 51))
    stream.update(order(5, "eu", 51), order(5, "eu", 52))
    stream.batch(SIZE)
    stream.update(rows[7], order(7, "eu", 71))
    stream.delete(order(3, "eu", 31))
    stream.tombstone(rows[3])
    return stream  # and three poison records (`_poison`) end the last batch


def _poison(config: IcekeeperConfig, topic: str) -> None:
    """A bad magic byte, an unknown schema id and a cut-off body, made from the topic's first
    value."""
    source = config.sources[0]
    [first] = [m.value() for m in topic_messages(source, topic, timeout_s=30)][:1]
    producer = Producer({"bootstrap.servers": source.bootstrap_servers})
    for value in (b"\x01" + first[1:], struct.pack(">bI", 0, 987_654_321) + first[5:], first[:40]):
        producer.produce(topic, value=value, partition=0)
    producer.flush()


def _rows(table) -> list[dict]:
    return sorted(table.scan().to_arrow().to_pylist(), key=lambda row: (row["id"], row["region"]))


def _metrics(table) -> dict:
    """The data files' value and null counts per field, summed, and the position deletes."""
    summed: dict[str, Counter] = {"value_counts": Counter(), "null_value_counts": Counter()}
    deletes = 0
    for entry in table.inspect.files().to_pylist():
        if entry["content"] == 1:
            deletes += entry["record_count"]
            continue
        for name, counts in summed.items():
            counts.update(dict(entry[name]))
    return {**{name: dict(counts) for name, counts in summed.items()}, "deletes": deletes}


def test_arrow_engine_writes_the_upsert_tables_spark_sql_writes(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    from icekeeper.samples.produce import produce_debezium_records

    configs = {
        engine: pipeline_config(
            tmp_path / engine,
            unique_topic,
            {
                "ICEKEEPER__WRITER__ENGINE": engine,
                **KEEP_WRITTEN_FILES,
                "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": str(SIZE),
                "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": f"{unique_topic}.{engine}.dlq",
                "ICEKEEPER__TABLES__0__IDENTIFIER": TABLES[0],
                "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id, region]",
                "ICEKEEPER__TABLES__1__IDENTIFIER": TABLES[1],
                "ICEKEEPER__TABLES__1__TOPICS": f"[{unique_topic}]",
                "ICEKEEPER__TABLES__1__PRIMARY_KEY": "[id, region]",
                "ICEKEEPER__TABLES__1__DELETE_MODE": "soft",
            },
        )
        for engine in ("spark-sql", "arrow")
    }
    assert all(table.upsert for table in configs["arrow"].tables)
    produce_debezium_records(configs["arrow"], ORDERS, _stream().records, unique_topic)
    _poison(configs["arrow"], unique_topic)

    written = {engine: run_batches(config, spark) for engine, config in configs.items()}

    reports = {engine: reports for engine, (reports, _) in written.items()}
    assert [r.records_read for r in reports["arrow"]] == [SIZE] * 5
    summary = lambda reports: [(r.rows_written, r.errors, r.tombstones_skipped) for r in reports]  # noqa: E731
    assert summary(reports["arrow"]) == summary(reports["spark-sql"])
    tables = {
        engine: [bookkeeper.catalog.load_table(identifier) for identifier in TABLES]
        for engine, (_, bookkeeper) in written.items()
    }
    for arrow_table, spark_table in zip(tables["arrow"], tables["spark-sql"], strict=True):
        assert str(arrow_table.schema()) == str(spark_table.schema())
        assert _rows(arrow_table) == _rows(spark_table)
        assert _metrics(arrow_table) == _metrics(spark_table)
        # The arrow engine wrote every batch's files itself (Spark names its files
        # part-<uuid>-c000), laid out as Spark lays them out.
        data_files = [e for e in arrow_table.inspect.files().to_pylist() if e["content"] == 0]
        assert not [e for e in data_files if e["file_path"].endswith("c000.zstd.parquet")]
        assert all("/_ik_deleted=false/" in entry["file_path"] for entry in data_files)

    hard, soft = (_rows(table) for table in tables["arrow"])
    live = [(2, 23, "sent"), (5, 52, "new"), (7, 71, "new"), (10, 101, "new"), (44, 40, "new")]
    assert [(row["id"], row["amount"], row["status"]) for row in hard] == live
    # Soft deletes keep the deleted keys' last rows (1, 3, 4, 6 and 8), flagged by the op.
    assert {row["id"]: row["_src_op"] for row in soft if row["_src_op"] == "d"} == {
        1: "d",
        3: "d",
        4: "d",
        6: "d",
        8: "d",
    }
    assert len(soft) == len(live) + 5

    dead = {}
    for engine, config in configs.items():
        source = config.sources[0]
        dead[engine] = sorted(
            (message.value(), sorted(message.headers() or []))
            for message in topic_messages(source, source.dead_letter_topic, timeout_s=60)
        )
    assert len(dead["arrow"]) == 3
    assert dead["arrow"] == dead["spark-sql"]


def _produce_to(config: IcekeeperConfig, topic: str, changes: list[tuple[int, str, dict]]) -> None:
    """(partition, op, row) changes of ORDERS, keyed and framed as Debezium's converter does."""
    source = config.sources[0]
    framer = ConfluentAvroFramer(registry_client(source), topic)
    value_id = framer.schema_id(ORDERS.value_schema(), is_key=False)
    key_id = framer.schema_id(ORDERS.key_schema(), is_key=True)
    producer = Producer({"bootstrap.servers": source.bootstrap_servers})
    for partition, op, row in changes:
        at = BinlogPosition(1_767_225_600_000, "b.1", 4, "g")
        before, after = {"c": (None, row), "u": (row, row), "d": (row, None)}[op]
        event = envelope(ORDERS, op, before, after, at, at.ts_ms)
        producer.produce(
            topic,
            key=framer.frame(key_id, ORDERS.key_of(row)),
            value=framer.frame(value_id, event),
            partition=partition,
        )
    producer.flush()


def test_a_key_in_two_kafka_partitions_of_a_batch_is_written_by_spark_sql(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """After a repartitioning a key's changes can sit in two partitions, so in two arrow tasks:
    the batch runs on `spark-sql`, which orders them by offset alone; the next batch, whose keys
    stay in their partitions, runs on arrow again."""
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__WRITER__ENGINE": "arrow",
            **KEEP_WRITTEN_FILES,
            "ICEKEEPER__TABLES__0__IDENTIFIER": TABLES[0],
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id, region]",
        },
    )
    ensure_topic(config.sources[0], unique_topic, 2)
    _produce_to(
        config,
        unique_topic,
        [
            (1, "c", order(1, "eu", 10)),
            (1, "c", order(3, "eu", 30)),
            (0, "c", order(2, "eu", 20)),
            (0, "c", order(4, "eu", 40)),
            (0, "u", order(1, "eu", 11)),  # offset 2 of partition 0, after offset 0 of partition 1
        ],
    )
    _, bookkeeper = run_batches(config, spark)
    _produce_to(config, unique_topic, [(0, "u", order(2, "eu", 21)), (1, "u", order(3, "eu", 31))])
    _, bookkeeper = run_batches(config, spark)

    table = bookkeeper.catalog.load_table(TABLES[0])
    assert [(row["id"], row["amount"]) for row in _rows(table)] == [
        (1, 11),
        (2, 21),
        (3, 31),
        (4, 40),
    ]
    assert _batches_by_writer_engine(table) == {(1, True), (2, False)}


def _batches_by_writer_engine(table) -> set[tuple[int, bool]]:
    """(batch, written by spark-sql) of each data file: the batch folder is
    <location>/data/<writer>/<seq>-<random>, and Spark's files end in c000.zstd.parquet."""
    return {
        (
            int(entry["file_path"].split("/data/")[1].split("/")[1].split("-")[0]),
            entry["file_path"].endswith("c000.zstd.parquet"),
        )
        for entry in table.inspect.files().to_pylist()
        if entry["content"] == 0
    }


def _batch_folders(table) -> dict[tuple[int, str], int]:
    """(batch, folder inside the batch folder) -> the data files it holds."""
    folders: Counter = Counter()
    for entry in table.inspect.files().to_pylist():
        if entry["content"] == 0:
            batch_folder, *inner, _ = entry["file_path"].split("/data/")[1].split("/")[1:]
            folders[(int(batch_folder.split("-")[0]), "/".join(inner))] += 1
    return dict(folders)


def test_a_batch_over_more_partitions_than_cores_writes_a_file_per_core_and_partition(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """Four Kafka partitions on two cores (the `spark` fixture's local[2]): each batch runs as
    two arrow tasks of two whole partitions, so at most two data files per table partition,
    where one task per partition wrote four; and the table is the one `spark-sql` writes."""
    configs = {
        engine: pipeline_config(
            tmp_path / engine,
            unique_topic,
            {
                "ICEKEEPER__WRITER__ENGINE": engine,
                **KEEP_WRITTEN_FILES,
                "ICEKEEPER__WRITER__DRIVER_BATCH_RECORDS": "0",  # a Spark job: tasks pickled
                "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "16",
                "ICEKEEPER__TABLES__0__IDENTIFIER": TABLES[0],
                "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id, region]",
                "ICEKEEPER__TABLES__0__PARTITION_BY": "[region]",
            },
        )
        for engine in ("spark-sql", "arrow")
    }
    ensure_topic(configs["arrow"].sources[0], unique_topic, 4)
    region = lambda key: "us" if key % 3 == 0 else "eu"  # noqa: E731
    changes = [(key % 4, "c", order(key, region(key), key * 10)) for key in range(1, 13)]
    changes += [(key % 4, "u", order(key, region(key), key * 10 + 1)) for key in range(1, 9)]
    changes += [(key % 4, "d", order(key, region(key), key * 10)) for key in (9, 10)]
    changes += [(key % 4, "u", order(key, region(key), key * 10 + 2)) for key in (1, 2, 3, 4)]
    changes += [(key % 4, "c", order(key, region(key), key * 10)) for key in range(13, 17)]
    _produce_to(configs["arrow"], unique_topic, changes)

    written = {engine: run_batches(config, spark) for engine, config in configs.items()}

    reports = {engine: reports for engine, (reports, _) in written.items()}
    assert sum(r.records_read for r in reports["arrow"]) == len(changes)
    assert len(reports["arrow"]) >= 2
    arrow_table, spark_table = (
        written[engine][1].catalog.load_table(TABLES[0]) for engine in ("arrow", "spark-sql")
    )
    assert _rows(arrow_table) == _rows(spark_table)
    assert _metrics(arrow_table) == _metrics(spark_table)
    assert [(row["id"], row["amount"]) for row in _rows(arrow_table)] == [
        *[(key, key * 10 + 2) for key in (1, 2, 3, 4)],
        *[(key, key * 10 + 1) for key in (5, 6, 7, 8)],
        *[(key, key * 10) for key in (11, 12, 13, 14, 15, 16)],
    ]
    folders = _batch_folders(arrow_table)
    assert {inner for _, inner in folders} == {
        "_ik_deleted=false/_ik_p0=eu",
        "_ik_deleted=false/_ik_p0=us",
    }
    assert max(folders.values()) <= 2, folders
    data_files = [e["file_path"] for e in arrow_table.inspect.files().to_pylist()]
    assert not [path for path in data_files if path.endswith("c000.zstd.parquet")]


def test_a_key_in_two_kafka_partitions_of_one_task_is_written_by_spark_sql(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """Four partitions on two cores: partitions 0 and 2 run in one arrow task (3, 3, 2 and 2
    records: largest first into the least loaded task). A key in both has no order within that
    task, so the batch runs on `spark-sql`, which orders it by offset alone; the next batch,
    whose keys stay in their partitions, runs on arrow again."""
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__WRITER__ENGINE": "arrow",
            **KEEP_WRITTEN_FILES,
            "ICEKEEPER__TABLES__0__IDENTIFIER": TABLES[0],
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id, region]",
        },
    )
    ensure_topic(config.sources[0], unique_topic, 4)
    _produce_to(
        config,
        unique_topic,
        [
            (2, "c", order(1, "eu", 10)),  # offset 0 of partition 2
            (2, "c", order(8, "eu", 80)),
            (0, "c", order(2, "eu", 20)),
            (0, "c", order(4, "eu", 40)),
            (0, "u", order(1, "eu", 11)),  # offset 2 of partition 0: read before partition 2
            *[(1, "c", order(key, "eu", key * 10)) for key in (5, 6, 7)],
            *[(3, "c", order(key, "eu", key * 10)) for key in (9, 10)],
        ],
    )
    _, bookkeeper = run_batches(config, spark)
    _produce_to(config, unique_topic, [(0, "u", order(2, "eu", 21)), (2, "u", order(8, "eu", 81))])
    _, bookkeeper = run_batches(config, spark)

    table = bookkeeper.catalog.load_table(TABLES[0])
    assert [(row["id"], row["amount"]) for row in _rows(table)] == [
        (1, 11),
        (2, 21),
        (4, 40),
        (5, 50),
        (6, 60),
        (7, 70),
        (8, 81),
        (9, 90),
        (10, 100),
    ]
    assert _batches_by_writer_engine(table) == {(1, True), (2, False)}
