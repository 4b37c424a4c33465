"""The dead-letter pass: a batch's records that cannot become rows, each with the reason.

Poison is rare, so the writing pass only counts failures (whichever engine wrote); when it
counted any, this second, filtered pass reads the batch's offsets again with Spark, decodes and
routes them as `spark-sql` does, and keeps the failed records raw (key, value, headers, Kafka
position) with their reason, cached: the batch counts them by reason, reconciles those counts
with the writing pass's, learns the schema ids their frames name, and sends them to the
dead-letter topic (`writers/dead_letters.py`), all without reading the batch a third time.
Tombstones that the source skips are not dead letters.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

from icekeeper.common.config.model import IcekeeperConfig, KafkaSource
from icekeeper.writers.confluent_frame import frame_prefix
from icekeeper.writers.dead_letters import send_dead_letters
from icekeeper.writers.engines import SourceBatch
from icekeeper.writers.spark_sql_engine import sql
from icekeeper.writers.spark_sql_engine.columns import ERROR
from icekeeper.writers.spark_sql_engine.decoding import (
    UNKNOWN_SCHEMA_ID,
    DecodedBatch,
    framed_schema_id_sql,
)
from icekeeper.writers.spark_sql_engine.kafka_source import read_raw
from icekeeper.writers.spark_sql_engine.sql_routing import routed_rows


class RejectedRecords:
    """One batch's rejected records, cached until `release`."""

    def __init__(self, frame: DataFrame) -> None:
        self.frame = frame.persist()

    def by_reason(self) -> dict[str, int]:
        """Reason -> records."""
        return {
            row["reason"]: int(row["count"])
            for row in self.frame.groupBy("reason").count().collect()
        }

    def unknown_schema_ids(self) -> set[int]:
        """The schema ids the frames of `unknown-schema-id` records name."""
        rows = (
            self.frame.where("reason = 'unknown-schema-id'")
            .selectExpr(f"{UNKNOWN_SCHEMA_ID} AS id")
            .distinct()
            .collect()
        )
        return {int(row[0]) for row in rows if row[0] is not None}

    def unknown_schema_topics(self) -> set[str]:
        """The topics of `unknown-schema-id` records."""
        return {
            row["topic"]
            for row in self.frame.where("reason = 'unknown-schema-id'")
            .select("topic")
            .distinct()
            .collect()
        }

    def key_schema_ids(self) -> set[int]:
        """The schema ids the record keys' frames of `delete-without-key` records name."""
        rows = (
            self.frame.where("reason = 'delete-without-key'")
            .selectExpr(f"{framed_schema_id_sql('key')} AS id")
            .distinct()
            .collect()
        )
        return {int(row["id"]) for row in rows if row["id"] is not None}

    def send(self, source: KafkaSource) -> None:
        """Produce them to the source's dead-letter topic."""
        send_dead_letters(self.frame, source)

    def release(self) -> None:
        self.frame.unpersist()


class DeadLetterPass:
    """Finds batches' rejected records, by `spark-sql`'s decoding and routing."""

    def __init__(
        self,
        config: IcekeeperConfig,
        spark: SparkSession,
        decode: Callable[[SourceBatch, DataFrame], DecodedBatch],
    ) -> None:
        """
        Args:
            decode: how `spark-sql` decodes the batch's raw records (`SparkSqlEngine.decode`).
        """
        self.config = config
        self.spark = spark
        self.decode = decode

    def rejected(self, batch: SourceBatch) -> RejectedRecords:
        source = batch.source
        raw = read_raw(self.spark, source, batch.plan, include_headers=True)
        decoded = self.decode(batch, raw)
        routed = routed_rows(decoded, batch.routes, self.config.tables)
        failed = routed.where(
            f"{ERROR} IS NOT NULL"
            + (f" AND {ERROR} != 'tombstone'" if source.tombstones == "skip" else "")
        )
        return RejectedRecords(
            failed.selectExpr(
                "key", "value", "headers", "topic", "partition", "offset", f"{ERROR} AS reason"
            )
        )

    def topics_naming(
        self, batch: SourceBatch, topics: set[str], schema_ids: list[int]
    ) -> set[str]:
        """Which of `topics` have records in the batch whose frames name one of `schema_ids`
        (reads the batch again)."""
        if not schema_ids:
            return set()
        prefixes = sql.in_list(
            "substring(value, 1, 5)",
            [sql.binary(frame_prefix(schema_id)) for schema_id in schema_ids],
        )
        topic_list = sql.in_list("topic", [sql.string(topic) for topic in sorted(topics)])
        raw = read_raw(self.spark, batch.source, batch.plan)
        return {
            row["topic"]
            for row in raw.where(f"{topic_list} AND {prefixes}")
            .select("topic")
            .distinct()
            .collect()
        }
