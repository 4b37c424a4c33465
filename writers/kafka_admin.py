"""Kafka's admin requests for one source: the partitions' offset bounds, the group's offsets.

A writer reads explicit offset ranges (planned in `offsets.py`), never through a subscription:
where it starts comes from the tables and its pending monikers, within the bounds asked for
here. The consumer group's offsets are only committed after a batch, so lag shows in Kafka's
tools (as in seed 000); the writer never reads them back. Each engine reads the ranges its own
way (`spark_sql_engine/kafka_source.py`, `arrow_engine/kafka_read.py`).
"""

from __future__ import annotations

import logging
import re

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from icekeeper.common.config.model import KafkaSource
from icekeeper.common.kafka_clients import Refusals, cluster_metadata, librdkafka_config
from icekeeper.writers.offsets import BatchPlan, PartitionBounds
from icekeeper.writers.offsets import TopicPartition as TP

log = logging.getLogger(__name__)


class SourceAdmin:
    """Admin requests to one source's Kafka: the bounds of its partitions, its group's offsets."""

    def __init__(self, source: KafkaSource) -> None:
        self.source = source
        self._client: AdminClient | None = None
        self._refusals = Refusals()
        self.readable_topics: set[str] = set()
        """The source's topics Kafka described without error at the last `bounds`."""
        self.unreadable_topics: dict[str, str] = {}
        """The source's topics Kafka listed with an error, or named in `topics` and not listed
        (deleted, not created yet, or not visible to this principal), at the last `bounds`:
        topic -> why. A topic a pattern matched that is no longer listed is simply not here."""

    @property
    def client(self) -> AdminClient:
        """One admin client per source for the writer's life (a client per batch cost ~70 ms)."""
        if self._client is None:
            self._client = AdminClient(
                librdkafka_config(self.source, {"error_cb": self._refusals}),
                logger=logging.getLogger("librdkafka"),
            )
        return self._client

    def bounds(self, instance_index: int, instance_count: int) -> dict[TP, PartitionBounds]:
        """Earliest and latest offsets of the source's partitions that this writer instance reads.

        Args:
            instance_index: this writer's index among `instance_count` writers; it reads the
                partitions whose number modulo `instance_count` is its index.
        """
        source = self.source
        admin = self.client
        # Credentials or a CA the cluster refuses stop the writer at once (KafkaAccessDenied).
        metadata = cluster_metadata(admin, source, self._refusals)
        topics = source.topics or sorted(
            t for t in metadata.topics if source.topic_pattern and _matches(source.topic_pattern, t)
        )
        partitions = []
        self.readable_topics, self.unreadable_topics = set(), {}
        for topic in topics:
            described = metadata.topics.get(topic)
            if described is None or described.error is not None:
                self.unreadable_topics[topic] = (
                    str(described.error)
                    if described is not None
                    else "not listed by Kafka (deleted, not created yet, or not visible to "
                    "this writer's principal)"
                )
                continue
            self.readable_topics.add(topic)
            partitions.extend(
                TopicPartition(topic, partition)
                for partition in sorted(described.partitions)
                if partition % instance_count == instance_index
            )
        if not partitions:
            return {}
        # Two batched ListOffsets requests for every partition, not a watermark round trip per
        # partition: with hundreds of small tables' partitions (seed 000) that was most of a batch.
        earliest = admin.list_offsets(
            {tp: OffsetSpec.earliest() for tp in partitions}, request_timeout=10
        )
        latest = admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in partitions}, request_timeout=10
        )
        low = {(tp.topic, tp.partition): future.result().offset for tp, future in earliest.items()}
        high = {(tp.topic, tp.partition): future.result().offset for tp, future in latest.items()}
        return {key: PartitionBounds(low[key], high[key]) for key in sorted(low)}

    def commit_group_offsets(self, plan: BatchPlan) -> None:
        """Set the consumer group's offsets to the end
        of the batch's read ranges (for lag reports)."""
        source = self.source
        offsets = [
            TopicPartition(topic, partition, until)
            for (topic, partition), (_, until) in plan.read_ranges.items()
        ]
        try:
            request = ConsumerGroupTopicPartitions(source.consumer_group, offsets)
            for future in self.client.alter_consumer_group_offsets(
                [request], request_timeout=source.commit_timeout
            ).values():
                future.result()
        except Exception as error:  # noqa: BLE001 - lag reporting must not stop the writer
            log.warning(
                "could not commit consumer group offsets",
                extra={"group": source.consumer_group, "error": str(error)},
            )


def _matches(pattern: str, topic: str) -> bool:
    return re.fullmatch(pattern, topic) is not None
