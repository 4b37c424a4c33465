"""Read one task's offset range with confluent-kafka: the raw records as Arrow arrays.

librdkafka reads several hundred thousand seed-like records a second per core; the records are
kept as Python bytes only until they are framed into one Avro block (`avro_block.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, TopicPartition

from common.config.model import KafkaSource
from common.kafka_clients import librdkafka_config
from writers.arrow_engine.tasks import TaskRange

_POLL_TIMEOUT_S = 30.0
_FETCH = {
    # As `writers/kafka_io.py`'s fetch sizes for Spark's consumer.
    "max.partition.fetch.bytes": 10_485_760,
    "fetch.max.bytes": 52_428_800,
    "queued.min.messages": 200_000,
}


@dataclass(frozen=True)
class RawRecords:
    """A task's records in offset order."""

    keys: list[bytes | None]
    values: list[bytes | None]
    offsets: pa.Array
    timestamps_ms: pa.Array


def read_range(source: KafkaSource, task: TaskRange) -> RawRecords:
    """Every record of `task`'s range (fewer when the range has gaps: compaction, transactions).

    Reads uncommitted records too, as Spark's Kafka source does by default, so both engines see
    the same records of a transactional topic.
    """
    consumer = Consumer(
        librdkafka_config(
            source,
            {
                "group.id": source.consumer_group,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_uncommitted",
                **_FETCH,
            },
        )
    )
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    offsets: list[int] = []
    timestamps: list[int] = []
    try:
        consumer.assign([TopicPartition(task.topic, task.partition, task.start)])
        last = task.until - 1
        done = task.until <= task.start
        while not done:
            messages = consumer.consume(num_messages=10_000, timeout=_POLL_TIMEOUT_S)
            if not messages:
                raise TimeoutError(
                    f"no records from {task.topic}:{task.partition} in {_POLL_TIMEOUT_S} s"
                )
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - librdkafka's name
                        done = True
                        break
                    raise RuntimeError(f"reading {task.topic}:{task.partition}: {error}")
                offset = message.offset()
                if offset > last:
                    done = True
                    break
                keys.append(message.key())
                values.append(message.value())
                offsets.append(offset)
                timestamps.append(message.timestamp()[1])
                if offset == last:
                    done = True
                    break
    finally:
        consumer.close()
    return RawRecords(keys, values, pa.array(offsets, pa.int64()), pa.array(timestamps, pa.int64()))
