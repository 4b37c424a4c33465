"""`writer.engine: arrow` and `spark-sql` agree on poison, and every record lands once (issue 26,
item 4): strings that are not UTF-8 (in `after`, in `before` of a delete, in a `source` field a
metadata column keeps: dead letters; in `before` of an update, in a `source` field no column
keeps: written), and every poison kind of the parity suite: a tombstone, a bad magic byte, an
unknown schema id, a cut-off body, a value that does not convert, a record no table claims.

The batches reconcile per table: a fan-out table added in the second batch, under a new writer,
starts the topic over while the first table starts after what it has, so the batch holds records
before one table's own start. Compared through pyiceberg after the bookkeeper's commits, with
the dead letters; on `main` the arrow engine neither wrote nor dead-lettered the record whose
`after` is not UTF-8."""

from __future__ import annotations

import struct
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.kafka_clients import registry_client
from icekeeper.samples.debezium import BinlogPosition, Column, TableShape, envelope
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic
from icekeeper.samples.readback import topic_messages
from icekeeper.writers.dead_letters import REASON_HEADER, SOURCE_OFFSET_HEADER
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import commit_all, pipeline_config

# Two engines, two batches each, and the dead-letter passes.
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.heavy]

NOTES = TableShape(
    server="s",
    db="shop",
    table="notes",
    columns=(
        Column("id", "int", optional=False),
        Column("note", "string"),
        Column("ts", "string", connect_name="io.debezium.time.ZonedTimestamp"),
    ),
    key=("id",),
)
OTHER = TableShape(server="s", db="shop", table="other", columns=NOTES.columns, key=("id",))
TABLES = ("shop.notes", "shop.notes_log")
MARK = "~~~~"
"""Written where a bad string goes, then replaced by as many bytes that are not UTF-8."""
NOT_UTF8 = b"\xff\xfe\xc3\x28"


def _note(key: int, note: str = "fine", ts: str = "2026-01-01T00:00:00Z") -> dict:
    return {"id": key, "note": note, "ts": ts}


class _Topic:
    """Records of the test's topic, framed as Debezium's Avro converter frames them."""

    def __init__(self, config: IcekeeperConfig, topic: str) -> None:
        source = config.sources[0]
        ensure_topic(source, topic, 1)
        self.topic = topic
        self.framer = ConfluentAvroFramer(registry_client(source), topic)
        self.producer = Producer({"bootstrap.servers": source.bootstrap_servers})
        self.count = 0

    def change(
        self,
        op: str,
        before: dict | None,
        after: dict | None,
        shape: TableShape = NOTES,
        **source: str,
    ) -> bytes:
        at = BinlogPosition(1_767_225_600_000 + self.count, "b.1", 4 + self.count, "g")
        event = envelope(shape, op, before, after, at, at.ts_ms)
        event["source"].update(source)
        value = self.framer.frame(self.framer.schema_id(shape.value_schema(), False), event)
        return self.send(value.replace(MARK.encode(), NOT_UTF8))

    def send(self, value: bytes | None) -> bytes | None:
        self.producer.produce(self.topic, key=b"k%d" % self.count, value=value, partition=0)
        self.count += 1
        return value


def _config(tmp_path: Path, topic: str, engine: str, catalog: str, second: bool) -> dict:
    settings = {
        "ICEKEEPER__WRITER__ENGINE": engine,
        "ICEKEEPER__CATALOG__NAME": catalog,
        "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": f"{topic}.{engine}.dlq",
        "ICEKEEPER__TABLES__0__IDENTIFIER": TABLES[0],
        "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
        "ICEKEEPER__TABLES__0__SOURCE_TABLE": "notes",
    }
    if second:
        settings |= {
            # A new writer: no checkpoint, so the new table starts the topic from its start.
            "ICEKEEPER__WRITER__WRITER_ID": "second",
            "ICEKEEPER__TABLES__1__IDENTIFIER": TABLES[1],
            "ICEKEEPER__TABLES__1__TOPICS": f"[{topic}]",
            "ICEKEEPER__TABLES__1__SOURCE_TABLE": "notes",
            "ICEKEEPER__TABLES__1__MODE": "changelog",
        }
    return pipeline_config(tmp_path / engine, topic, settings)


def test_the_engines_agree_on_poison_and_every_record_lands_once(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    engines = ("spark-sql", "arrow")
    catalogs = {engine: f"cat_{uuid.uuid4().hex[:8]}" for engine in engines}
    first = {e: _config(tmp_path, unique_topic, e, catalogs[e], False) for e in engines}
    second = {e: _config(tmp_path, unique_topic, e, catalogs[e], True) for e in engines}
    topic = _Topic(first["arrow"], unique_topic)
    topic.change("c", None, _note(1))  # offset 0
    topic.change("c", None, _note(2))
    topic.change("c", None, _note(3, MARK))  # 2: invalid-utf8
    topic.producer.flush()
    reports = {e: WriterJob(first[e], spark=spark).run(until_idle=True) for e in engines}
    for engine in engines:
        commit_all(first[engine])

    topic.change("u", _note(1, MARK), _note(1, "updated"))  # 3: `before` of an update: written
    topic.change("d", _note(2, MARK), None)  # 4: invalid-utf8
    topic.send(None)  # 5: a tombstone, skipped
    topic.change("c", None, _note(4), query=MARK)  # 6: no column keeps source.query: written
    topic.change("c", None, _note(5), file=MARK)  # 7: _src_file: invalid-utf8
    good = topic.change("c", None, _note(6, ts="infinity"))  # 8: unconvertible-value
    topic.change("c", None, _note(7), shape=OTHER)  # 9: unroutable
    topic.send(b"\x01" + good[1:])  # 10: bad-magic-byte
    topic.send(struct.pack(">bI", 0, 987_654_321) + good[5:])  # 11: unknown-schema-id
    topic.send(good[:30])  # 12: undecodable-avro
    topic.change("c", None, _note(8))  # 13
    topic.change("d", _note(1, "updated"), None)  # 14
    topic.producer.flush()
    for engine in engines:
        reports[engine] += WriterJob(second[engine], spark=spark).run(until_idle=True)
    tables = {}
    for engine in engines:
        bookkeeper = commit_all(second[engine])
        tables[engine] = [bookkeeper.catalog.load_table(identifier) for identifier in TABLES]

    figures = lambda rs: [  # noqa: E731
        (r.records_read, r.rows_written, r.dead_lettered, r.tombstones_skipped, r.errors)
        for r in rs
    ]
    assert figures(reports["arrow"]) == figures(reports["spark-sql"])
    assert [r.records_read for r in reports["arrow"]] == [3, 15]
    for arrow_table, spark_table in zip(tables["arrow"], tables["spark-sql"], strict=True):
        assert str(arrow_table.schema()) == str(spark_table.schema())
        arrow_rows = arrow_table.scan().to_arrow().sort_by("_kfk_offset").to_pylist()
        assert arrow_rows == spark_table.scan().to_arrow().sort_by("_kfk_offset").to_pylist()
    # The arrow engine wrote its files itself (Spark names its files part-<uuid>-c000).
    for table in tables["arrow"]:
        paths = table.inspect.files().column("file_path").to_pylist()
        assert paths and not [path for path in paths if path.endswith("c000.zstd.parquet")]
    mirror, log = (
        table.scan().to_arrow().sort_by("_kfk_offset").to_pylist() for table in tables["arrow"]
    )
    assert [(row["id"], row["note"]) for row in mirror] == [(2, "fine"), (4, "fine"), (8, "fine")]
    assert [row["_kfk_offset"] for row in log] == [0, 1, 3, 6, 13, 14]

    dead = {}
    for engine in engines:
        source = second[engine].sources[0]
        dead[engine] = sorted(
            (message.value(), sorted(message.headers() or []))
            for message in topic_messages(source, source.dead_letter_topic, timeout_s=60)
        )
    assert dead["arrow"] == dead["spark-sql"]
    reasons = Counter(
        (dict(headers)[REASON_HEADER].decode(), int(dict(headers)[SOURCE_OFFSET_HEADER]))
        for _, headers in dead["arrow"]
    )
    # The second batch reads the first one's records again (for the new table), dead letters
    # included: dead letters are sent at least once.
    assert reasons == {
        ("invalid-utf8", 2): 2,
        ("invalid-utf8", 4): 1,
        ("invalid-utf8", 7): 1,
        ("unconvertible-value", 8): 1,
        ("unroutable", 9): 1,
        ("bad-magic-byte", 10): 1,
        ("unknown-schema-id", 11): 1,
        ("undecodable-avro", 12): 1,
    }
    # Every record of the new table's range once: a row, a dead letter or a skipped tombstone.
    second_dead = {offset for (_, offset), _ in reasons.items()}
    assert sorted([row["_kfk_offset"] for row in log] + sorted(second_dead) + [5]) == list(
        range(15)
    )
