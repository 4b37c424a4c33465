"""A task's Kafka read takes its range, not the rest of the partition: librdkafka prefetches until
its queue holds `queued.min.messages`, and every record it fetches is decompressed and parsed in
the task's process (`kafka_read.fetch_settings`)."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, Producer

from common.config import IcekeeperConfig
from icekeeper.samples.produce import ensure_topic
from writers.arrow_engine import kafka_read
from writers.arrow_engine.tasks import TaskRange

RECORDS = 120_000
RANGE = 10_000


def _produce(
    bootstrap_servers: str, topic: str, partitions: int, records: int, compression: str = "none"
) -> None:
    """`records` records of 100 bytes in each partition, numbered from 0."""
    ensure_topic(bootstrap_servers, topic, partitions)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            "linger.ms": 20,
            "queue.buffering.max.messages": 2 * records * partitions,
            "compression.type": compression,
            "batch.size": 1_000_000,
        }
    )
    for partition in range(partitions):
        for number in range(records):
            producer.produce(topic, value=b"%08d" % number + b"x" * 92, partition=partition)
            if number % 10_000 == 0:
                producer.poll(0)
    producer.flush(30)


@pytest.mark.integration
def test_a_range_read_fetches_about_its_range(
    local_stack, stack_config: IcekeeperConfig, unique_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = stack_config.sources[0].model_copy(
        # Small fetches, so that what a read takes is decided by its queue, not by one response.
        update={"consumer_properties": {"max.partition.fetch.bytes": "262144"}}
    )
    _produce(source.bootstrap_servers, unique_topic, 1, RECORDS)
    received: list[int] = []

    class ConsumerWithStatistics(Consumer):
        """Reports what it received, including what its fetcher took after the range was read."""

        def __init__(self, settings: dict) -> None:
            super().__init__(
                {**settings, "statistics.interval.ms": 50, "stats_cb": self._statistics}
            )

        def _statistics(self, text: str) -> None:
            received.append(json.loads(text)["rxmsgs"])

        def close(self) -> None:
            time.sleep(0.5)  # the fetcher goes on until its queue is full
            # Queued messages are dropped, so polls serve the statistics queued behind them.
            self.unassign()
            for _ in range(5):
                self.poll(0.1)
            super().close()

    monkeypatch.setattr(kafka_read, "Consumer", ConsumerWithStatistics)
    raw = kafka_read.read_range(source, TaskRange(0, unique_topic, 0, 0, RANGE))

    assert len(raw.values) == RANGE
    assert raw.values[-1].as_py().startswith(b"%08d" % (RANGE - 1))
    assert received, "librdkafka sent no statistics"
    # Unbounded (200,000 queued), the consumer took the whole partition: 120,000.
    assert max(received) < 4 * RANGE


@pytest.mark.integration
def test_a_task_reads_its_second_range_without_waiting(
    local_stack, stack_config: IcekeeperConfig, unique_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One consumer reads a task's ranges one after the other (`range_consumer`): the second
    range's records come as soon as asked for, not after librdkafka's fetch backoff (1 s by
    default, which two empty 0.5 s `consume` calls waited out). As in `icekeeper bench upsert`:
    lz4 batches, a range from the middle of a partition whose first fetch holds more than the
    range."""
    source = stack_config.sources[0]
    span = 5 * RANGE
    _produce(source.bootstrap_servers, unique_topic, 2, 3 * span, "lz4")
    empty_calls: list[int] = []

    class CountingConsumer(Consumer):
        def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
            messages = super().consume(num_messages=num_messages, timeout=timeout)
            if not messages:
                empty_calls.append(num_messages)
            return messages

    monkeypatch.setattr(kafka_read, "Consumer", CountingConsumer)
    ranges = [TaskRange(0, unique_topic, partition, span, 2 * span) for partition in (0, 1)]
    with kafka_read.range_consumer(source, span) as consumer:
        read = [kafka_read.read_range(source, task, consumer=consumer) for task in ranges]

    assert [len(raw.values) for raw in read] == [span, span]
    assert [raw.offsets[-1].as_py() for raw in read] == [2 * span - 1, 2 * span - 1]
    assert len(empty_calls) < 2, f"{len(empty_calls)} consume calls of 0.5 s returned nothing"
