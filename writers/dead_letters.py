"""Send records that cannot become rows to the dead-letter topic, raw, with the reason in headers.

Poison is rare, so this runs as a second, filtered pass over the batch's offsets only when the
first pass counted errors. Headers keep the record's own headers and add `icekeeper.reason`,
`icekeeper.source.topic`, `.partition` and `.offset`, so a record can be found and replayed.
Delivery is at least once: a writer that dies after this step and before its moniker is
published sends the same records again on restart (same source offsets in the headers). So does
a batch that reads records again without any failure: a source's batch starts at its tables'
lowest position, so after a refusal rewinds one table (an overlapping or out-of-order moniker),
or a topic restart, or a table added later, the records between that position and the others'
are classified again and their dead letters sent again. The source topic, partition and offset
headers identify a record: a consumer of the dead-letter topic dedupes by them (`icekeeper
dead-letters replay` does).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from icekeeper.common.config.model import KafkaSource
from icekeeper.common.kafka_clients import spark_kafka_options

REASON_HEADER = "icekeeper.reason"
SOURCE_TOPIC_HEADER = "icekeeper.source.topic"
SOURCE_PARTITION_HEADER = "icekeeper.source.partition"
SOURCE_OFFSET_HEADER = "icekeeper.source.offset"


def send_dead_letters(failed: DataFrame, source: KafkaSource) -> None:
    """Produce `failed` rows (columns key, value, headers, topic, partition, offset, reason) to the
    source's dead-letter topic, connecting as the source's other clients do."""

    def header(name: str, value) -> F.Column:  # noqa: ANN001
        return F.struct(F.lit(name).alias("key"), value.cast("binary").alias("value"))

    ours = F.array(
        header(REASON_HEADER, F.col("reason")),
        header(SOURCE_TOPIC_HEADER, F.col("topic")),
        header(SOURCE_PARTITION_HEADER, F.col("partition").cast("string")),
        header(SOURCE_OFFSET_HEADER, F.col("offset").cast("string")),
    )
    headers = F.when(F.col("headers").isNull(), ours).otherwise(F.concat(F.col("headers"), ours))
    (
        failed.select(
            F.lit(source.dead_letter_topic).alias("topic"), "key", "value", headers.alias("headers")
        )
        .write.format("kafka")
        .mode("append")
        .options(**spark_kafka_options(source))
        .option("kafka.enable.idempotence", "true")
        .option("kafka.acks", "all")
        .save()
    )
