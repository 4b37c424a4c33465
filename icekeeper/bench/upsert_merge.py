"""The baseline of `icekeeper bench upsert`: how a
Spark user mirrors a CDC topic into Iceberg today.

A Structured Streaming query reads the topic (trigger `availableNow`, `maxOffsetsPerTrigger` as
large as our writer's batches), decodes and flattens every record as our writer does, and its
`foreachBatch` keeps the last change of each key (by Kafka offset; `MERGE INTO` refuses two
source rows for one target row) and runs `MERGE INTO` an Iceberg format-v2 table whose merges,
updates and deletes are merge-on-read: position deletes, as ours, rather than rewritten data files.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from icekeeper.common.catalog import DEFAULT_TABLE_PROPERTIES, open_catalog
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.schema import op_column, resolve_named_types
from icekeeper.writers.registry import RegisteredSchema
from icekeeper.writers.spark_sql_engine import sql
from icekeeper.writers.spark_sql_engine.columns import (
    ERROR,
    HELPER_COLUMNS,
    KAFKA_OFFSET,
    KAFKA_PARTITION,
)
from icekeeper.writers.spark_sql_engine.decoding import decode_avro_confluent
from icekeeper.writers.spark_sql_engine.sql_flatten import flatten
from icekeeper.writers.table_batch import table_schema
from icekeeper.writers.version_shapes import envelope_fields

MERGE_ON_READ = {
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}


def flat_changes(
    config: IcekeeperConfig,
    kafka_frame: DataFrame,
    schema_text: str,
    schema_id: int,
    primary_key: list[str],
) -> tuple[DataFrame, Schema]:
    """Table rows of a Kafka frame (batch or stream) with our writer's decoding and flattening, the
    Kafka position helpers kept; and the flattened Iceberg schema."""
    metadata = config.metadata_columns
    registered = RegisteredSchema(
        schema_id, schema_text, resolve_named_types(json.loads(schema_text))
    )
    # The envelope fields our writer decodes: the same work on both sides.
    decoded = decode_avro_confluent(
        kafka_frame.withColumn("headers", F.lit(None)), [registered], envelope_fields(metadata)
    )
    schema = table_schema(decoded.versions, metadata, None, primary_key)
    flat = flatten(decoded.frame, decoded.versions, metadata, schema)
    return flat.frame.where(F.col(ERROR).isNull()), flat.schema


def create_merge_table(config: IcekeeperConfig, identifier: str, schema: Schema) -> Table:
    """The baseline's table: our flattened columns (nullable, as Spark's are), our table
    properties, and merge-on-read for MERGE, UPDATE and DELETE."""
    catalog = open_catalog(config)
    namespace = identifier.rsplit(".", 1)[0]
    if (namespace,) not in catalog.list_namespaces():
        catalog.create_namespace(namespace)
    fields = [field.model_copy(update={"required": False}) for field in schema.fields]
    return catalog.create_table(
        identifier, schema=Schema(*fields), properties={**DEFAULT_TABLE_PROPERTIES, **MERGE_ON_READ}
    )


def merge_statement(target: str, source_view: str, key_columns: list[str], op: str) -> str:
    """MERGE of a batch's last change per key: deletes
    remove the row, other changes replace or insert it."""
    on = " AND ".join(f"t.{sql.ident(key)} = s.{sql.ident(key)}" for key in key_columns)
    deleted = f"s.{sql.ident(op)} = 'd'"
    return (
        f"MERGE INTO {target} t USING {source_view} s ON {on} "
        f"WHEN MATCHED AND {deleted} THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET * "
        f"WHEN NOT MATCHED AND NOT {deleted} THEN INSERT *"
    )


def run_merge_baseline(
    spark: SparkSession,
    config: IcekeeperConfig,
    topic: str,
    schema_text: str,
    schema_id: int,
    identifier: str,
    key_columns: list[str],
    batch_records: int,
    checkpoint: Path,
) -> dict[str, float]:
    """Mirror `topic` into a new table `identifier` with `foreachBatch` + `MERGE INTO`.

    Returns:
        `seconds` from the query's start to its last batch's commit, and `batches`.
    """
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.sources[0].bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(batch_records))
        .option("minPartitions", str(spark.sparkContext.defaultParallelism))
        .load()
    )
    rows, schema = flat_changes(config, stream, schema_text, schema_id, key_columns)
    if not open_catalog(config).table_exists(
        identifier
    ):  # else made with its starting rows (upsert_table_rows.py)
        create_merge_table(config, identifier, schema)
    target = f"{config.catalog.name}.{identifier}"
    view = f"bench_changes_{identifier.replace('.', '_')}"
    statement = merge_statement(target, view, key_columns, op_column(config.metadata_columns))
    latest = Window.partitionBy(*[F.col(sql.ident(key)) for key in key_columns]).orderBy(
        F.col(KAFKA_OFFSET).desc(), F.col(KAFKA_PARTITION).desc()
    )
    batches = 0

    def merge_batch(batch: DataFrame, batch_id: int) -> None:
        nonlocal batches
        last = (
            batch.withColumn("_last", F.row_number().over(latest))
            .where("_last = 1")
            .drop("_last", *HELPER_COLUMNS)
        )
        last.createOrReplaceTempView(view)
        batch.sparkSession.sql(statement)
        batches += 1

    started = time.monotonic()
    query = (
        rows.writeStream.foreachBatch(merge_batch)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    query.awaitTermination()
    return {"seconds": time.monotonic() - started, "batches": batches}
