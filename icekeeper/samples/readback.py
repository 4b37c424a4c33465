"""Read a topic back from the beginning and decode it through the registry, seed-000 style.

Used by the demo and the tests to show that what was produced is really in Kafka and decodes
with the registry's schemas (the seed article's `partition = 0, offset = 0, key=..., value=...`
listing). Not the writers' decoder: this is the reference one, record by record.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from common.config.model import KafkaSource


@dataclass(frozen=True)
class DecodedRecord:
    partition: int
    offset: int
    timestamp_ms: int
    key: Any
    value: Any
    schema_id: int | None

    def listing(self) -> str:
        return f"partition = {self.partition}, offset = {self.offset}, key={self.key}, value={self.value}, schemaId={self.schema_id}"


def read_topic(source: KafkaSource, topic: str, timeout_s: float = 30.0) -> list[DecodedRecord]:
    """Every record of `topic` from offset 0 to the current end, decoded; ordered by partition, offset."""
    consumer = Consumer({
        "bootstrap.servers": source.bootstrap_servers,
        "group.id": f"icekeeper-readback-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }, logger=logging.getLogger("librdkafka"))
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": source.schema_registry_url}))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[DecodedRecord] = []
        remaining = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout_s
        while remaining and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            value_bytes = message.value()
            schema_id = int.from_bytes(value_bytes[1:5], "big") if value_bytes and value_bytes[0] == 0 else None
            key = deserializer(message.key(), SerializationContext(topic, MessageField.KEY))
            value = deserializer(value_bytes, SerializationContext(topic, MessageField.VALUE))
            records.append(DecodedRecord(message.partition(), message.offset(), message.timestamp()[1], key, value, schema_id))
            if message.offset() + 1 >= ends[message.partition()]:
                remaining.discard(message.partition())
        if remaining:
            raise TimeoutError(f"partitions {sorted(remaining)} of {topic} not read to the end in {timeout_s}s")
        return sorted(records, key=lambda record: (record.partition, record.offset))
    finally:
        consumer.close()
