"""`avro-confluent` on `spark-sql`: each record decoded by the registered schema its frame names
(`decoding.decode_avro_confluent`), Debezium envelopes' unused `source`/`transaction` fields
skipped, and the record keys of deletes without `before` read where tables have primary keys."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from icekeeper.common.config.model import MetadataColumns
from icekeeper.writers.engines import SourceBatch
from icekeeper.writers.key_columns import record_keys_for
from icekeeper.writers.spark_sql_engine.decoding import DecodedBatch, decode_avro_confluent
from icekeeper.writers.version_shapes import envelope_fields


def decode(
    spark: SparkSession, raw: DataFrame, batch: SourceBatch, metadata: MetadataColumns
) -> DecodedBatch:
    keys = record_keys_for(batch.routes.tables, batch.key_schemas)
    return decode_avro_confluent(raw, batch.schemas, envelope_fields(metadata), keys)
