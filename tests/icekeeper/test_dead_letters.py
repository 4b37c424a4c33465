"""`icekeeper dead-letters list | replay` (issue 14, item 1): what was set aside goes back, once."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

import icekeeper.writers.dead_letters as writer_dead_letters
from icekeeper import dead_letters
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.cli import build_parser
from icekeeper.common.catalog import open_catalog
from icekeeper.common.committed_state import committed_state
from icekeeper.common.transports import open_transport
from icekeeper.dead_letters import REPLAY_OF_HEADER, run_dead_letters
from icekeeper.samples.produce import ensure_topic
from tests.support.pipeline import pipeline_config
from tests.support.shop_items import bookkeeper_config, make_moniker


def command(config, capsys, *arguments: str) -> dict:
    """Run `icekeeper dead-letters <arguments> --json` on `config`; its JSON output."""
    args = build_parser().parse_args(["dead-letters", *arguments, "--json"])
    assert run_dead_letters(config, args) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def committed_records(servers: str, topic: str, expected: int) -> list[Message]:
    """The topic's committed records: read until `expected`
    came (30 s at most), then 3 s more for any extra."""
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"t-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        partitions = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        messages: list[Message] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                messages.append(message)
                if len(messages) == expected:
                    deadline = min(deadline, time.monotonic() + 3)
        return messages
    finally:
        consumer.close()


def table_offsets(bookkeeper: Bookkeeper) -> list[int]:
    return sorted(
        bookkeeper.catalog.load_table("shop.items")
        .scan(selected_fields=("_kfk_offset",))
        .to_arrow()
        .column("_kfk_offset")
        .to_pylist()
    )


def test_a_quarantined_moniker_is_listed_with_its_reason_and_replayed_once(
    tmp_path: Path, capsys
) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    first, broken, third = (
        make_moniker(config, 1, None, (0, 10)),
        make_moniker(config, 2, 1, (10, 20)),
        make_moniker(config, 3, 2, (20, 30)),
    )
    damaged = Path(broken.files[0].path.removeprefix("file://"))
    good_bytes = damaged.read_bytes()
    damaged.write_bytes(b"\0" * len(good_bytes))  # overwritten in place: not Parquet
    for moniker in (first, broken, third):
        transport.publish(moniker)
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 2 and len(report.dead_lettered) == 1
    assert table_offsets(bookkeeper) == list(range(10)) + list(range(20, 30))

    [listed] = command(config, capsys, "list", "--monikers")["monikers"]
    assert (listed["table"], listed["writer_id"], listed["seq"], listed["records"]) == (
        "shop.items",
        "w1",
        2,
        10,
    )
    assert "unreadable" in listed["reason"] and listed["offsets"] == ["items[0] 10..20"]

    damaged.write_bytes(good_bytes)  # the cause is fixed (the file restored from a backup)
    assert command(config, capsys, "replay", "--monikers")["monikers"] == [listed["name"]]
    assert command(config, capsys, "list", "--monikers")["monikers"] == []
    assert bookkeeper.run_cycle().committed_monikers == 1
    assert table_offsets(bookkeeper) == list(range(30))
    state = committed_state(bookkeeper.catalog.load_table("shop.items"))
    assert state.quarantined_records == 0 and state.quarantined_monikers == ()

    # Published again (a replay that crashed before it
    # took the copy out, run twice): not added again.
    transport.publish(broken)
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 0 and len(report.tables[0].duplicates) == 1
    assert table_offsets(bookkeeper) == list(range(30))


def test_a_refused_overlapping_moniker_replays_as_a_duplicate(tmp_path: Path, capsys) -> None:
    """An earlier version's writer (its monikers lack `rereads_refused`) has its refused moniker
    dead-lettered; replaying it adds nothing twice."""
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    transport.publish(make_moniker(config, 1, None, (0, 10), writer_id="w1"))
    bookkeeper.run_cycle()
    transport.publish(
        make_moniker(config, 1, None, (5, 15), writer_id="w2").model_copy(
            update={"rereads_refused": None}
        )
    )
    assert len(bookkeeper.run_cycle().dead_lettered) == 1
    [listed] = command(config, capsys, "list", "--monikers")["monikers"]
    assert "overlap" in listed["reason"]
    command(config, capsys, "replay", "--monikers")
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 0 and len(report.tables[0].duplicates) == 1
    assert table_offsets(bookkeeper) == list(range(10))


def test_the_record_headers_are_the_writers() -> None:
    for name in (
        "REASON_HEADER",
        "SOURCE_TOPIC_HEADER",
        "SOURCE_PARTITION_HEADER",
        "SOURCE_OFFSET_HEADER",
    ):
        assert getattr(dead_letters, name) == getattr(writer_dead_letters, name)


@pytest.mark.integration
def test_dead_lettered_records_go_back_to_their_topic_once(
    local_stack, tmp_path: Path, unique_topic: str, capsys
) -> None:
    dead_letter_topic = unique_topic + ".dlq"
    config = pipeline_config(
        tmp_path, unique_topic, {"ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": dead_letter_topic}
    )
    servers = config.sources[0].bootstrap_servers
    ensure_topic(servers, unique_topic, 2)
    ensure_topic(servers, dead_letter_topic, 1)

    # Record 9 of partition 1 reached the table after all (the writer dead-lettered it, died, and
    # decoded it after a restart once the registry was back).
    catalog = open_catalog(config)
    identifier = config.tables[0].identifier
    catalog.create_namespace(identifier.rsplit(".", 1)[0])
    rows = pa.table(
        {
            "_kfk_topic": [unique_topic],
            "_kfk_partition": pa.array([1], pa.int32()),
            "_kfk_offset": pa.array([9], pa.int64()),
        }
    )
    catalog.create_table(identifier, schema=rows.schema).append(rows)

    def dead_letter(offset: int, value: bytes, reason: str) -> None:
        headers = [
            ("trace", b"t-%d" % offset),
            (writer_dead_letters.REASON_HEADER, reason.encode()),
            (writer_dead_letters.SOURCE_TOPIC_HEADER, unique_topic.encode()),
            (writer_dead_letters.SOURCE_PARTITION_HEADER, b"1"),
            (writer_dead_letters.SOURCE_OFFSET_HEADER, str(offset).encode()),
        ]
        producer.produce(dead_letter_topic, key=b"k%d" % offset, value=value, headers=headers)

    producer = Producer({"bootstrap.servers": servers})
    dead_letter(5, b"five", "schema id 7 not found")
    dead_letter(7, b"seven", "schema id 7 not found")
    dead_letter(
        5, b"five", "schema id 7 not found"
    )  # the same record again: a writer that redid its batch
    dead_letter(9, b"nine", "schema id 7 not found")
    producer.flush(30)

    listing = command(config, capsys, "list", "--records")["records"]
    assert [(r["source"]["offset"], r["reason"]) for r in listing] == [
        (o, "schema id 7 not found") for o in (5, 7, 5, 9)
    ]

    # A replay that died mid-batch: it had marked the batch and produced the first copy, no more.
    consumer = Consumer(
        {"bootstrap.servers": servers, "group.id": dead_letters.replay_group(config.sources[0])}
    )
    mark = json.dumps({"producing_from": {f"{unique_topic}/1": 0}})
    consumer.commit(
        offsets=[TopicPartition(dead_letter_topic, 0, 0, metadata=mark)], asynchronous=False
    )
    consumer.close()
    producer.produce(
        unique_topic,
        key=b"k5",
        value=b"five",
        partition=1,
        headers=[("trace", b"t-5"), (REPLAY_OF_HEADER, f"{dead_letter_topic}/0/0".encode())],
    )
    producer.flush(30)

    [outcome] = command(config, capsys, "replay", "--records")["records"]
    assert (outcome["replayed"], outcome["already_replayed"], outcome["already_in_a_table"]) == (
        1,
        2,
        1,
    )
    replayed = committed_records(servers, unique_topic, 2)
    assert sorted((m.partition(), m.key(), m.value()) for m in replayed) == [
        (1, b"k5", b"five"),
        (1, b"k7", b"seven"),
    ]
    # Plain records at consecutive offsets: no transaction
    # markers, which writers would take for lost records.
    assert sorted(m.offset() for m in replayed) == [0, 1]
    for message in replayed:
        headers = dict(message.headers())
        assert (
            headers["trace"] == b"t-" + message.key()[1:]
        )  # the record's own headers travel; ours do not
        assert writer_dead_letters.REASON_HEADER not in headers and headers[
            REPLAY_OF_HEADER
        ].startswith(dead_letter_topic.encode())

    [again] = command(config, capsys, "replay", "--records")["records"]
    assert again["replayed"] == 0
    assert len(committed_records(servers, unique_topic, 2)) == 2
