"""Sample producers against the real Kafka and schema registry, read back as a user would."""

from __future__ import annotations

import collections
import io
import struct

import fastavro
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient

from icekeeper.common.config import IcekeeperConfig
from icekeeper.samples import seed000
from icekeeper.samples.produce import produce_seed_sample, produce_synthetic
from icekeeper.samples.readback import read_topic
from icekeeper.samples.synthetic import (
    SyntheticSpec,
    expected_state,
    schema_versions,
    synthetic_events,
)
from tests.support.seed000 import ARTICLE_RESULT


def test_seed_sample_events_reproduce_the_articles_result_table() -> None:
    final = seed000.expected_final_rows()
    assert sorted(id1 for id1, _ in final) == sorted(ARTICLE_RESULT)
    for (id1, _), row in final.items():
        values, _ = ARTICLE_RESULT[id1]
        assert (
            row["C2"],
            row.get("C3"),
            row.get("C4"),
            row.get("C5"),
            row.get("C6"),
            row["UPDATE_TIME"],
        ) == values


@pytest.mark.integration
def test_produce_sample_writes_the_seed_stream_through_the_registry(
    local_stack, stack_config: IcekeeperConfig, unique_topic: str
) -> None:
    report = produce_seed_sample(stack_config, topic=unique_topic, progress=lambda message: None)
    assert report["records"] == len(seed000.sample_events())
    records = read_topic(stack_config.sources[0], unique_topic)

    assert len(records) == report["records"]
    assert {record.partition for record in records} == {0, 1, 2}
    # Offsets are dense per partition: the article's positions hold.
    for offsets in _offsets_by_partition(records).values():
        assert offsets == list(range(len(offsets)))
    # Four value schema versions, in which C3, then C5 and C4, then C6 appear.
    registry = SchemaRegistryClient({"url": stack_config.sources[0].schema_registry_url})
    fields_by_id = {}
    for schema_id in {record.schema_id for record in records}:
        schema = fastavro.parse_schema(
            __import__("json").loads(registry.get_schema(schema_id).schema_str)
        )
        after = next(field for field in schema["fields"] if field["name"] == "before")["type"][1]
        fields_by_id[schema_id] = [field["name"] for field in after["fields"]]
    columns = sorted(fields_by_id.values(), key=len)
    assert [set(b) - set(a) for a, b in zip(columns, columns[1:])] == [{"C3"}, {"C4", "C5"}, {"C6"}]
    # Keys are ID1/ID2 records; the envelope is intact; the last event per key is the article's row.
    by_position = {(record.partition, record.offset): record for record in records}
    for id1, (values, position) in ARTICLE_RESULT.items():
        record = by_position[position]
        assert record.key == {"ID1": id1, "ID2": "A"}
        assert set(record.value) == {"before", "after", "source", "op", "ts_ms", "transaction"}
        assert record.value["source"]["table"] == "tbl_test_1" and record.value["op"] in ("c", "u")
        assert record.value["after"]["C2"] == values[0]


@pytest.mark.integration
def test_a_topic_read_back_slowly_is_read_to_its_end(
    local_stack, stack_config: IcekeeperConfig, unique_topic: str
) -> None:
    """Chaos verifies a million records by reading the topic back and decoding each record as it
    comes: on a busy machine that takes longer than the read's timeout in total. The timeout
    means "nothing arrives", not "the reader is slow"."""
    import time

    from icekeeper.samples.readback import topic_messages

    produce_seed_sample(stack_config, topic=unique_topic, progress=lambda message: None)
    read = 0
    started = time.monotonic()
    for _ in topic_messages(stack_config.sources[0], unique_topic, timeout_s=2.0):
        read += 1
        time.sleep(0.3)  # the caller's work per record
    assert time.monotonic() - started > 2.0
    assert read == len(seed000.sample_events())


def _offsets_by_partition(records) -> dict[int, list[int]]:
    offsets = collections.defaultdict(list)
    for record in records:
        offsets[record.partition].append(record.offset)
    return offsets


def test_synthetic_stream_is_reproducible_and_has_the_requested_shape() -> None:
    spec = SyntheticSpec(
        seed=7,
        keys=200,
        events=5000,
        update_ratio=0.5,
        delete_ratio=0.2,
        schema_changes=3,
        poison_ratio=0.02,
    )
    first, second = list(synthetic_events(spec)), list(synthetic_events(spec))
    assert first == second
    good = [event for event in first if event.poison is None]
    poison = [event for event in first if event.poison is not None]
    assert len(good) == 5000
    assert 0.01 < len(poison) / len(first) < 0.03
    assert {event.poison for event in poison} == {
        "bad-magic-byte",
        "unknown-schema-id",
        "truncated-avro",
    }
    ops = collections.Counter(event.op for event in good)
    assert 0.15 < ops["d"] / len(good) < 0.25
    # Schema changes: add a column, widen int -> long, add another column.
    shapes = schema_versions(spec)
    assert [len(shape.columns) for shape in shapes] == [7, 8, 8, 9]
    amount_types = [
        next(c.avro_type for c in shape.columns if c.name == "amount") for shape in shapes
    ]
    assert amount_types == ["int", "int", "long", "long"]
    assert sorted({event.version for event in good}) == [1, 2, 3, 4]
    # A different seed gives a different stream.
    assert list(synthetic_events(SyntheticSpec(seed=8, keys=200, events=50))) != first[:50]


@pytest.mark.integration
def test_synthetic_poison_messages_really_fail_to_decode(
    local_stack, stack_config: IcekeeperConfig, unique_topic: str
) -> None:
    spec = SyntheticSpec(seed=3, keys=100, events=3000, schema_changes=2, poison_ratio=0.03)
    report = produce_synthetic(
        stack_config, spec, topic=unique_topic, partitions=3, progress=lambda message: None
    )
    assert report["events"] == 3000

    registry = SchemaRegistryClient({"url": stack_config.sources[0].schema_registry_url})
    schemas: dict[int, object] = {}
    decoded_ok, failures = 0, collections.Counter()
    for value in _raw_values(stack_config, unique_topic, report["records"]):
        try:
            magic, schema_id = struct.unpack(">bI", value[:5])
            if magic != 0:
                raise ValueError("bad-magic-byte")
            if schema_id not in schemas:
                schemas[schema_id] = fastavro.parse_schema(
                    __import__("json").loads(registry.get_schema(schema_id).schema_str)
                )
            body = io.BytesIO(value[5:])
            fastavro.schemaless_reader(body, schemas[schema_id])
            if body.tell() != len(value) - 5:
                raise ValueError("trailing bytes")
            decoded_ok += 1
        except Exception as error:  # noqa: BLE001 - classifying every way decoding fails
            failures[type(error).__name__] += 1
    assert decoded_ok == report["events"]
    assert sum(failures.values()) == sum(report["poison"].values()) > 0


def _raw_values(config: IcekeeperConfig, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": config.sources[0].bootstrap_servers,
            "group.id": f"raw-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, partition, 0) for partition in range(3)])
    values: list[bytes] = []
    try:
        while len(values) < expected:
            batch = consumer.consume(num_messages=10_000, timeout=5)
            if not batch:
                break
            values.extend(message.value() for message in batch if not message.error())
    finally:
        consumer.close()
    return values


def test_expected_state_follows_the_last_event_per_key() -> None:
    spec = SyntheticSpec(seed=5, keys=20, events=400, delete_ratio=0.3)
    state = expected_state(spec)
    last = {}
    for event in synthetic_events(spec):
        last[event.key["id"]] = event
    assert {key: (event.value["after"]) for key, event in last.items()} == state
    assert any(row is None for row in state.values()) and any(
        row is not None for row in state.values()
    )
