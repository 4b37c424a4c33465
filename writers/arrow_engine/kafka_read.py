"""Read one task's offset range with confluent-kafka: the raw records as Arrow arrays.

librdkafka reads several hundred thousand seed-like records a second per core; the records are
kept as Python bytes only until they are framed into one Avro block (`avro_block.py`).
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from operator import itemgetter

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from icekeeper.common.config.model import KafkaSource
from icekeeper.common.kafka_clients import librdkafka_config
from icekeeper.writers.arrow_engine.consumer_settings import librdkafka_settings
from icekeeper.writers.arrow_engine.task_ranges import TaskRange

_STALL_S = 30.0
"""A task fails when Kafka gives it nothing for this long."""
_WAIT_S = 0.5
"""Longest wait of one `consume` call: librdkafka's batch call waits its whole timeout unless it
got every message asked for, so at a partition's end (EOF) a long timeout is idle time."""
_BATCH = 10_000
_FETCH = {
    # As `spark_sql_engine/kafka_source.py`'s fetch sizes for Spark's consumer.
    "max.partition.fetch.bytes": 10_485_760,
    "fetch.max.bytes": 52_428_800,
}
_MOST_QUEUED = 200_000
_SECOND = itemgetter(1)
"""A message's `timestamp()` is (type, milliseconds)."""


class KafkaReadError(RuntimeError):
    """Kafka did not give a task its range: an error from the broker, or nothing for `_STALL_S`.
    Its name reaches the writer in the task's traceback (`writers/observability.py` counts it)."""


def fetch_settings(records: int) -> dict[str, int]:
    """librdkafka's fetch settings for reading a range of `records` records.

    librdkafka prefetches until its queue holds `queued.min.messages`, past the range's end when
    the partition goes on: with 200,000 queued, a task reading 50,000 records of a 250,000-record
    partition received all 250,000 (its `rxmsgs` statistic) and decompressed and parsed them, 1.9x
    the CPU of a queue bounded by the range (0.755 -> 0.395 CPU-s for four such reads, medians of
    three; librdkafka's fetcher thread included). Bounded by the range, it receives the range and
    at most one fetch more. Never under one `consume` call's worth (`_BATCH`): a call waits until
    it has all it asked for.
    """
    return {**_FETCH, "queued.min.messages": max(_BATCH, min(_MOST_QUEUED, records))}


@dataclass(frozen=True)
class RawRecords:
    """A task's records in offset order."""

    values: pa.BinaryArray
    offsets: pa.Array
    timestamps_ms: pa.Array
    keys: list[bytes | None]
    """Empty unless asked for (`read_range`'s `with_keys`)."""


def read_range(source: KafkaSource, task: TaskRange, with_keys: bool = False) -> RawRecords:
    """Every record of `task`'s range (fewer when the range has gaps: compaction, transactions).

    A consumer of its own per range: one consumer moved to a task's next range by `assign`
    (or `incremental_assign`, with or without an `unassign` first) returned nothing from its
    first `consume` until the call's whole timeout had passed, 0.5 s per range even for two
    records. Reads uncommitted records too, as Spark's Kafka source does by default, so both
    engines see the same records of a transactional topic.
    """
    consumer = Consumer(
        librdkafka_config(
            source,
            {
                "group.id": source.consumer_group,
                "isolation.level": "read_uncommitted",
                **fetch_settings(task.records),
                # The user's settings win, as on `spark-sql`, except what reading a range needs.
                **librdkafka_settings(source.consumer_properties),
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            },
        )
    )
    try:
        return _read(consumer, task, with_keys)
    finally:
        consumer.close()


def _read(consumer: Consumer, task: TaskRange, with_keys: bool) -> RawRecords:
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    offsets: list[int] = []
    timestamps: list[int] = []
    last = task.until - 1
    consumer.assign([TopicPartition(task.topic, task.partition, task.start)])
    done = task.until <= task.start
    stalled_since = time.monotonic()
    while not done:
        # Ask for no more than the range holds: the call then returns as soon as it is read.
        remaining = task.until - (offsets[-1] + 1 if offsets else task.start)
        messages = consumer.consume(num_messages=max(1, min(_BATCH, remaining)), timeout=_WAIT_S)
        if not messages:
            if time.monotonic() - stalled_since > _STALL_S:
                raise KafkaReadError(
                    f"no records from {task.topic}:{task.partition} in {_STALL_S} s"
                )
            continue
        stalled_since = time.monotonic()
        if any(map(Message.error, messages)):  # an error is never None, and never false
            for error in filter(None, map(Message.error, messages)):
                if error.code() != KafkaError._PARTITION_EOF:  # noqa: SLF001 - librdkafka's name
                    raise KafkaReadError(f"reading {task.topic}:{task.partition}: {error}")
            done = True
            messages = [m for m in messages if m.error() is None]
        # One `map` of the unbound method per field: no Python frame per record (a comprehension
        # per field cost 1.5-2x as much on 100,000 messages; a loop of appends a third more).
        offsets.extend(map(Message.offset, messages))
        values.extend(map(Message.value, messages))
        timestamps.extend(map(_SECOND, map(Message.timestamp, messages)))
        if with_keys:
            keys.extend(map(Message.key, messages))
        if offsets and offsets[-1] >= last:
            done = True
    count = bisect.bisect_right(offsets, last)
    return RawRecords(
        pa.array(values[:count] if count < len(values) else values, pa.binary()),
        pa.array(offsets[:count], pa.int64()),
        pa.array(timestamps[:count], pa.int64()),
        keys[:count],
    )
