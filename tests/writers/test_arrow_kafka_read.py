"""A task's Kafka read takes its range, not the rest of the partition: librdkafka prefetches until
its queue holds `queued.min.messages`, and every record it fetches is decompressed and parsed in
the task's process (`kafka_read.fetch_settings`)."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer, Producer

from common.config import IcekeeperConfig
from icekeeper.samples.produce import ensure_topic
from writers.arrow_engine import kafka_read
from writers.arrow_engine.tasks import TaskRange

RECORDS = 120_000
RANGE = 10_000


@pytest.mark.integration
def test_a_range_read_fetches_about_its_range(
    local_stack, stack_config: IcekeeperConfig, unique_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = stack_config.sources[0].model_copy(
        # Small fetches, so that what a read takes is decided by its queue, not by one response.
        update={"consumer_properties": {"max.partition.fetch.bytes": "262144"}}
    )
    ensure_topic(source.bootstrap_servers, unique_topic, 1)
    producer = Producer(
        {
            "bootstrap.servers": source.bootstrap_servers,
            "linger.ms": 20,
            "queue.buffering.max.messages": 2 * RECORDS,
        }
    )
    for number in range(RECORDS):
        producer.produce(unique_topic, value=b"%08d" % number + b"x" * 92)
        if number % 10_000 == 0:
            producer.poll(0)
    producer.flush(30)
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
            for _ in range(10):  # the fetcher goes on until its queue is full
                self.poll(0.1)
            super().close()

    monkeypatch.setattr(kafka_read, "Consumer", ConsumerWithStatistics)
    raw = kafka_read.read_range(source, TaskRange(0, unique_topic, 0, 0, RANGE))

    assert len(raw.values) == RANGE
    assert raw.values[-1].as_py().startswith(b"%08d" % (RANGE - 1))
    assert received, "librdkafka sent no statistics"
    # Unbounded (200,000 queued), the consumer took the whole partition: 120,000.
    assert max(received) < 4 * RANGE
