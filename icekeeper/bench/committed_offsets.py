"""When each record of a topic became readable in a table: the first snapshot covering its offset.

The bookkeeper records in each snapshot's summary the next offset of every topic-partition the
table covers. A record at offset `o` is in the table from the first snapshot whose offset for its
partition is past `o`; that snapshot's visibility comes from the snapshot observer
(`snapshot_observer.py`), a reader outside the pipeline. Matching by offsets works for every
table mode: an upsert table's change may leave no row of its own (a later change of its key
replaced it, or it was a delete), yet it is applied from that snapshot on.
"""

from __future__ import annotations

import uuid
from bisect import bisect_right

from icekeeper.bench.snapshot_observer import SeenSnapshot
from icekeeper.common.config import IcekeeperConfig


def record_delays(
    config: IcekeeperConfig, seen: list[SeenSnapshot], topic: str, since_ms: int
) -> list[tuple[int, float]]:
    """(Kafka timestamp in ms, seconds until a snapshot covering it was visible) for every record
    of `topic` produced at or after `since_ms` that a seen snapshot covers."""
    from confluent_kafka import Consumer, TopicPartition

    covered: dict[int, tuple[list[int], list[int]]] = {}
    for snapshot in seen:
        for (name, partition), until in snapshot.offsets.items():
            if name == topic:
                untils, times = covered.setdefault(partition, ([], []))
                if not untils or until > untils[-1]:
                    untils.append(until)
                    times.append(snapshot.visible_ms)
    consumer = Consumer(
        {
            "bootstrap.servers": config.sources[0].bootstrap_servers,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    delays: list[tuple[int, float]] = []
    try:
        for partition, (untils, times) in covered.items():
            end = untils[-1]
            consumer.assign([TopicPartition(topic, partition, 0)])
            position = 0
            while position < end:
                messages = consumer.consume(10_000, timeout=10)
                if not messages:
                    raise TimeoutError(
                        f"{topic}[{partition}]: no records after offset {position} "
                        f"(committed up to {end})"
                    )
                for message in messages:
                    if message.error():
                        raise RuntimeError(str(message.error()))
                    position = message.offset() + 1
                    kafka_ms = message.timestamp()[1]
                    if kafka_ms >= since_ms and message.offset() < end:
                        visible_ms = times[bisect_right(untils, message.offset())]
                        delays.append((kafka_ms, (visible_ms - kafka_ms) / 1000))
    finally:
        consumer.close()
    return delays
