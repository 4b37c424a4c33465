"""A source's `consumer_properties` (Java Kafka client settings) for the arrow engine's librdkafka.

Users write them for Spark's Java consumer (seed 000's `kafka.consumer.*`). Most have the same
name in librdkafka (`fetch.min.bytes`, `max.partition.fetch.bytes`, `isolation.level`,
`session.timeout.ms`, `client.rack`, ...); a few are spelt differently (`_RENAMED`); a few only
steer the Java client's group assignment, which the tasks do not use (they assign their
partitions). librdkafka itself says whether it takes a name and its value: a batch whose source
sets one it refuses runs on `spark-sql`, which names it (`support.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaException

_RENAMED = {
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    # librdkafka's request.timeout.ms is a producer setting; socket.timeout.ms times requests.
    "request.timeout.ms": "socket.timeout.ms",
}
"""Java consumer property -> the librdkafka property that does the same."""
_ASSIGNMENT_ONLY = {"partition.assignment.strategy", "exclude.internal.topics"}
"""Settings of the Java client's group assignment: tasks assign their partitions themselves."""
_refused: dict[tuple[str, str], bool] = {}
"""(librdkafka name, value) -> whether librdkafka refused it (asked once per process)."""


def librdkafka_settings(consumer_properties: Mapping[str, str]) -> dict[str, str]:
    """The properties a task's confluent-kafka consumer gets, by librdkafka's names."""
    return {
        _RENAMED.get(name, name): value
        for name, value in consumer_properties.items()
        if name not in _ASSIGNMENT_ONLY
    }


def refused_properties(consumer_properties: Mapping[str, str]) -> list[str]:
    """The properties (by the user's names) whose name or value librdkafka does not take."""
    return sorted(
        name
        for name, value in consumer_properties.items()
        if name not in _ASSIGNMENT_ONLY and _refuses(_RENAMED.get(name, name), value)
    )


def _refuses(name: str, value: str) -> bool:
    """Whether librdkafka refuses `name: value`: a consumer is created with it (no connection
    is made before a partition is assigned), the only complete list of what it takes."""
    key = (name, value)
    if key not in _refused:
        try:
            Consumer({"group.id": "icekeeper-probe", name: value}).close()
            _refused[key] = False
        except KafkaException:
            _refused[key] = True
    return _refused[key]
