"""A task's Kafka read takes its range, not the rest of the partition: librdkafka prefetches until
its queue holds `queued.min.messages`, and every record it fetches is decompressed and parsed in
the task's process (`kafka_read.fetch_settings`)."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, Producer

from icekeeper.common.config import IcekeeperConfig
from icekeeper.samples.produce import ensure_topic
from icekeeper.writers.arrow_engine import kafka_read
from icekeeper.writers.arrow_engine.task import TaskPlan, run_task
from icekeeper.writers.arrow_engine.task_ranges import TaskGroup, TaskRange

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
def test_a_task_reads_each_of_its_ranges_without_waiting(
    local_stack, stack_config: IcekeeperConfig, unique_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task of an upsert batch reads whole partitions, one range after the other: each range's
    records come as soon as asked for. One consumer moved from range to range waited a whole
    0.5 s `consume` timeout for each later range, even for the last two records of a partition
    (the small batch that ends `icekeeper bench upsert`: 0.08 s became 0.57 s)."""
    source = stack_config.sources[0]
    _produce(source.bootstrap_servers, unique_topic, 2, RANGE)
    empty_calls: list[int] = []

    class CountingConsumer(Consumer):
        def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
            messages = super().consume(num_messages=num_messages, timeout=timeout)
            if not messages:
                empty_calls.append(num_messages)
            return messages

    monkeypatch.setattr(kafka_read, "Consumer", CountingConsumer)
    plan = TaskPlan(source, [], [], {}, [], stack_config.metadata_columns)
    tail = TaskGroup(
        0, tuple(TaskRange(0, unique_topic, partition, RANGE - 2, RANGE) for partition in (0, 1))
    )
    facts = run_task(plan, tail)

    assert facts.records == 4
    assert facts.errors == {"bad-magic-byte": 4}  # the records are no Confluent frames
    assert not empty_calls, f"{len(empty_calls)} consume calls of 0.5 s returned nothing"
