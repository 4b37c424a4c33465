"""A one-partition topic of synthetic events that tests delete and create again (topic reset)."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.kafka_clients import librdkafka_config
from icekeeper.samples.produce import ensure_topic, produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from tests.support.pipeline import pipeline_config
from tests.support.waiting import wait_until

TABLE = "shop.orders"


def topic_config(
    tmp_path: Path, topic: str, extra: dict[str, str] | None = None
) -> IcekeeperConfig:
    """One changelog table keyed by `id` on `topic`, plus `extra` environment settings."""
    return pipeline_config(
        tmp_path,
        topic,
        {
            "ICEKEEPER__TABLES__0__IDENTIFIER": TABLE,
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            **(extra or {}),
        },
    )


def produce(config: IcekeeperConfig, topic: str, seed: int, events: int) -> None:
    """`events` synthetic changes of 50 keys into the topic's single partition."""
    produce_synthetic(
        config,
        SyntheticSpec(seed=seed, keys=50, events=events, schema_changes=0),
        topic=topic,
        partitions=1,
        progress=lambda m: None,
    )


def recreate(config: IcekeeperConfig, topic: str) -> None:
    """Delete `topic` and create it again, empty, once Kafka has finished deleting it."""
    admin = AdminClient(librdkafka_config(config.sources[0]))
    for future in admin.delete_topics([topic]).values():
        future.result(timeout=30)

    def recreated() -> bool:
        try:
            ensure_topic(config.sources[0], topic, 1)
        except KafkaException:  # still being deleted
            return False
        return True

    wait_until(recreated, 60, f"{topic} created again after its deletion", interval_s=0.5)
