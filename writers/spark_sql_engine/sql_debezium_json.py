"""`debezium-json` on `spark-sql`: one version per Kafka Connect schema the records carry, and
per topic for records without one (typed by inference); see `decoding.decode_json`."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from icekeeper.common.config.model import MetadataColumns
from icekeeper.writers.engines import SourceBatch
from icekeeper.writers.key_columns import record_keys_for
from icekeeper.writers.spark_sql_engine.decoding import DecodedBatch, decode_json


def decode(
    spark: SparkSession, raw: DataFrame, batch: SourceBatch, metadata: MetadataColumns
) -> DecodedBatch:
    keys = record_keys_for(batch.routes.tables, batch.key_schemas)
    return decode_json(spark, raw, debezium=True, keys=keys)
