"""Read a topic back from the beginning and decode it through the registry, seed-000 style.

Used by the demo and the tests to show that what was produced is really in Kafka and decodes
with the registry's schemas (the seed article's `partition = 0, offset = 0, key=..., value=...`
listing). Not the writers' decoder: this is the reference one, record by record.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icekeeper.common.config.model import KafkaSource
from icekeeper.common.kafka_clients import Cluster, librdkafka_config, registry_client


@dataclass(frozen=True)
class DecodedRecord:
    partition: int
    offset: int
    timestamp_ms: int
    key: Any
    value: Any
    schema_id: int | None

    def listing(self) -> str:
        return (
            f"partition = {self.partition}, offset = {self.offset}, key={self.key}, "
            f"value={self.value}, schemaId={self.schema_id}"
        )


def topic_messages(cluster: Cluster, topic: str, timeout_s: float = 300.0) -> Iterator[Message]:
    """Every record of `topic` from offset 0 to its end as of the call, undecoded; nothing if the
    topic does not exist. Partitions interleave; each partition's records come in offset order.

    Raises:
        TimeoutError: a partition was not read to its end within `timeout_s`.
    """
    consumer = Consumer(
        librdkafka_config(cluster, {"group.id": f"icekeeper-readback-{uuid.uuid4().hex[:8]}"}),
        logger=logging.getLogger("librdkafka"),
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
    finally:
        consumer.close()
    if metadata is None or metadata.error is not None:
        return
    yield from partition_messages(
        cluster, {(topic, partition): 0 for partition in metadata.partitions}, timeout_s
    )


def partition_messages(
    cluster: Cluster, starts: dict[tuple[str, int], int], timeout_s: float = 300.0
) -> Iterator[Message]:
    """Every record of each (topic, partition) in `starts` from its
    start offset (or the first one retention kept) to the partition's
    end as of the call, undecoded; each partition in offset order.

    Raises:
        TimeoutError: no record of the remaining partitions arrived for `timeout_s`. The clock
            restarts at each record: the caller decodes and compares each one as it comes, so a
            million records read on a busy machine take longer than any fixed total would allow.
    """
    consumer = Consumer(
        librdkafka_config(
            cluster,
            {
                "group.id": f"icekeeper-readback-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            },
        ),
        logger=logging.getLogger("librdkafka"),
    )
    try:
        ends = {
            key: consumer.get_watermark_offsets(TopicPartition(*key), timeout=10)[1]
            for key in starts
        }
        remaining = {key for key, end in ends.items() if end > starts[key]}
        consumer.assign(
            [
                TopicPartition(topic, partition, starts[(topic, partition)])
                for topic, partition in remaining
            ]
        )
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"partitions {sorted(remaining)} not read to their ends: no record for "
                    f"{timeout_s}s"
                )
            message = consumer.poll(1)
            if (
                message is None
                or message.error()
                or (key := (message.topic(), message.partition())) not in remaining
            ):
                continue
            yield message
            deadline = time.monotonic() + timeout_s
            if message.offset() + 1 >= ends[key]:
                remaining.discard(key)
    finally:
        consumer.close()


def read_topic(source: KafkaSource, topic: str, timeout_s: float = 30.0) -> list[DecodedRecord]:
    """Every record of `topic` from offset 0 to the
    current end, decoded; ordered by partition, offset."""
    deserializer = AvroDeserializer(registry_client(source))
    records = []
    for message in topic_messages(source, topic, timeout_s):
        value_bytes = message.value()
        schema_id = (
            int.from_bytes(value_bytes[1:5], "big") if value_bytes and value_bytes[0] == 0 else None
        )
        key = deserializer(message.key(), SerializationContext(topic, MessageField.KEY))
        value = deserializer(value_bytes, SerializationContext(topic, MessageField.VALUE))
        records.append(
            DecodedRecord(
                message.partition(), message.offset(), message.timestamp()[1], key, value, schema_id
            )
        )
    return sorted(records, key=lambda record: (record.partition, record.offset))
