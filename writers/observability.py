"""Prometheus metrics of a writer's batches, served with health on `writer.http_port`.

The server is the one every role uses (`common/http_endpoints.py`). Every number comes from what
the writer's loop already knows: lag is Kafka's end offset of each partition (the ListOffsets
answer every batch asks for to plan its ranges, `kafka_admin.SourceAdmin.bounds`) minus the next
offset each table needs there (what it committed, what this writer's pending monikers cover, what
this writer finished), so measuring it costs no consumer and no request of its own; it is as
current as the writer's last look at Kafka (each batch, every `writer.trigger_interval` when idle).
Records, dead letters and fallbacks are counted once a source's batch is published, so a batch
that fails and is read again counts once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from icekeeper.writers.offsets import TopicPartition

BATCH_OUTCOMES = ("written", "idle", "throttled", "paused", "failed")
"""How a batch of the loop ended: it read records; it found none; it read nothing because the
bookkeeper is behind (`writer.max_pending_bytes`); the schema registry did not answer; it failed
(retried)."""

KAFKA_MARKERS = ("org.apache.kafka", "sql.kafka010", "KafkaException", "KafkaError", "KafkaRead")
"""Text that names Kafka's clients in an error that reached the writer through Spark (a task's
Java or Python traceback arrives as text): Kafka's Java client and Spark's Kafka source, librdkafka
through confluent-kafka, and the arrow engine's own `KafkaReadError`."""


class WriterMetrics:
    """The metrics one writer exposes (its own registry, so tests can run several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.lag = Gauge(
            "icekeeper_writer_lag_records",
            "Records of the partition after the next offset the table needs (Kafka's end offset "
            "minus the table's position), as of the writer's last look at Kafka",
            ["table", "topic", "partition"],
            registry=self.registry,
        )
        self.end_offset = Gauge(
            "icekeeper_writer_partition_end_offset",
            "Kafka's end offset (high watermark) of the partition at the writer's last look",
            ["topic", "partition"],
            registry=self.registry,
        )
        self.batch_duration = Histogram(
            "icekeeper_writer_batch_duration_seconds",
            "Time of one batch that read records, from planning to its monikers published",
            registry=self.registry,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
        )
        self.batch_records = Histogram(
            "icekeeper_writer_batch_records",
            "Records one batch read from Kafka (batches that read any)",
            registry=self.registry,
            buckets=(10, 100, 1_000, 10_000, 50_000, 100_000, 250_000, 500_000, 1_000_000),
        )
        self.batches = Counter(
            "icekeeper_writer_batches_total",
            "Batches of the loop by outcome: written, idle, throttled, paused, failed",
            ["outcome"],
            registry=self.registry,
        )
        self.last_batch = Gauge(
            "icekeeper_writer_last_batch_timestamp_seconds",
            "When the last batch that read records ended (0: none yet)",
            registry=self.registry,
        )
        self.records_read = Counter(
            "icekeeper_writer_records_read_total",
            "Records read from Kafka in published batches",
            ["source"],
            registry=self.registry,
        )
        self.records_written = Counter(
            "icekeeper_writer_records_written_total",
            "Rows written to the table's Parquet files, as its published monikers count them",
            ["table"],
            registry=self.registry,
        )
        self.written_bytes = Counter(
            "icekeeper_writer_written_bytes_total",
            "Bytes of the files the table's published monikers name",
            ["table"],
            registry=self.registry,
        )
        self.monikers = Counter(
            "icekeeper_writer_monikers_published_total",
            "Monikers published (offset-only ones included)",
            ["table"],
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "icekeeper_writer_dead_letters_total",
            "Records sent to the source's dead-letter topic, by reason",
            ["source", "reason"],
            registry=self.registry,
        )
        self.tombstones_skipped = Counter(
            "icekeeper_writer_tombstones_skipped_total",
            "Tombstones the source skips (`tombstones: skip`)",
            ["source"],
            registry=self.registry,
        )
        self.lost_to_retention = Counter(
            "icekeeper_writer_records_lost_to_retention_total",
            "Records Kafka's retention deleted before this writer read them",
            ["source"],
            registry=self.registry,
        )
        self.engine_fallbacks = Counter(
            "icekeeper_writer_engine_fallbacks_total",
            "Source batches `spark-sql` wrote for `writer.engine: arrow`, by reason: arrow did not "
            "take them, or its counts did not reconcile (`unreconciled`)",
            ["source", "reason"],
            registry=self.registry,
        )
        self.kafka_read_errors = Counter(
            "icekeeper_writer_kafka_read_errors_total",
            "Failed reads from Kafka: `offsets` (metadata and end offsets), `records` (a batch's "
            "records)",
            ["source", "stage"],
            registry=self.registry,
        )
        self.pending_bytes = Gauge(
            "icekeeper_writer_pending_bytes",
            "Bytes of the pending monikers of this writer's tables (back-pressure above "
            "`writer.max_pending_bytes`)",
            registry=self.registry,
        )
        self._lag_series: dict[str, set[tuple[str, str, str]]] = {}
        """Per source, the lag series shown last: a partition no longer read is dropped."""
        self._end_series: dict[str, set[tuple[str, str]]] = {}
        """Per source, the end-offset series shown last (dropped like the lag series)."""

    def show_sources(self, sources: list[str]) -> None:
        """Every source's error series at 0 before the first error: a rate or an alert on a
        series that does not exist yet sees nothing."""
        for outcome in BATCH_OUTCOMES:
            self.batches.labels(outcome)
        for source in sources:
            self.records_read.labels(source)
            for stage in ("offsets", "records"):
                self.kafka_read_errors.labels(source, stage)

    def show_lag(
        self,
        source: str,
        end_offsets: Mapping[TopicPartition, int],
        positions: Mapping[str, Mapping[TopicPartition, int]],
        table_topics: Mapping[str, set[str]] | None = None,
    ) -> None:
        """Set the lag of every table of `source` on every partition it reads.

        Args:
            end_offsets: Kafka's end offset of each partition this writer reads.
            positions: per table, the next offset it needs per partition.
            table_topics: the topics a table is routed from, where its config names them (a
                source of 200 topics, one table each, would otherwise show each table's lag on
                every topic: 120,000 series, and a table lagging wherever any topic lags).
        """
        shown = set()
        ends_shown = {(topic, str(partition)) for topic, partition in end_offsets}
        for (topic, partition), end in end_offsets.items():
            self.end_offset.labels(topic, str(partition)).set(end)
        # A partition this writer reads no more (its topic deleted or no longer visible, or
        # another instance's now) must not show its last end offset for ever.
        others = set().union(*(s for name, s in self._end_series.items() if name != source))
        for labels in self._end_series.get(source, set()) - ends_shown - others:
            self.end_offset.remove(*labels)
        self._end_series[source] = ends_shown
        for table, table_positions in positions.items():
            topics = (table_topics or {}).get(table)
            for (topic, partition), end in end_offsets.items():
                if topics is not None and topic not in topics:
                    continue
                position = table_positions.get((topic, partition), end)
                labels = (table, topic, str(partition))
                self.lag.labels(*labels).set(max(0, end - position))
                shown.add(labels)
        for labels in self._lag_series.get(source, set()) - shown:
            self.lag.remove(*labels)
        self._lag_series[source] = shown

    def observe_batch(self, records: int, seconds: float) -> None:
        self.batch_duration.observe(seconds)
        self.batch_records.observe(records)
        self.batches.labels("written").inc()
        self.last_batch.set(time.time())


def kafka_read_error(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is a failed read from Kafka, as far as its type and text
    tell (see `KAFKA_MARKERS`)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = f"{type(current).__module__}.{type(current).__name__}: {current}"
        if any(marker in text for marker in KAFKA_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False
