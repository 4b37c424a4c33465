"""The rows `icekeeper bench upsert --table-rows N` starts every table with: a source table larger
than the keys it changes.

A mirror holds the whole source table, and an hour's changes touch a small part of it. With
`table_rows` > 0, every side's table starts with the same N rows whose keys lie above the change
plan's (`keys` ... `keys + N - 1`), as a Debezium snapshot reads them (op `r`), decoded and
flattened as our writer does. The change stream never touches them, so every side ends with the
plan's final state plus these rows.

They are loaded untimed and once: Spark writes them into a template table, and each run's table
starts as a fast append of the template's data files (the same files, by reference), so no side
pays for loading and every side starts from identical files. What they show is how each side's
cost grows with the table: `MERGE INTO` joins the whole table every batch, ours looks up only the
batch's keys in the bookkeeper's index (warmed from the table before the clock starts, as a
running bookkeeper's index is).
"""

from __future__ import annotations

from typing import Any

from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from icekeeper.bench.upsert_data import ChangePlan, confluent_records, envelope_frame
from icekeeper.bench.upsert_merge import flat_changes
from icekeeper.common.catalog import DEFAULT_TABLE_PROPERTIES, open_catalog
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.writers.spark_sql_engine.columns import HELPER_COLUMNS

_SNAPSHOT_TS = "2025-12-31 23:00:00"  # the snapshot was read before the plan's changes (2026-01-01)


def table_rows_plan(spark: SparkSession, plan: ChangePlan, rows: int, partitions: int) -> DataFrame:
    """The table rows as plan rows (seq, op `r`, key, prev_seq, born_seq, partition): key
    `plan.keys + i` is row image `plan.changes + i`, in the partition Debezium keys it to."""
    first_key, first_seq = plan.keys, plan.changes
    return spark.range(rows).select(
        (F.col("id") + first_seq).alias("seq"),
        F.lit("r").alias("op"),
        (F.col("id") + first_key).alias("key"),
        F.lit(-1).cast("long").alias("prev_seq"),
        (F.col("id") + first_seq).alias("born_seq"),
        ((F.col("id") + first_key) % partitions).cast("int").alias("partition"),
    )


def write_template(
    spark: SparkSession,
    config: IcekeeperConfig,
    loaded: dict[str, Any],
    plan: ChangePlan,
    rows: int,
    partitions: int,
    schema: Schema,
    identifier: str,
) -> list[DataFile]:
    """Write the table rows into a new table `identifier` of `schema` (the schema our writer gave
    the warm-up table), through our decoding and flattening; its data files."""
    # Each partition's offsets in key order, as a consumer of the snapshot topic would see them.
    envelopes = envelope_frame(table_rows_plan(spark, plan, rows, partitions)).withColumn(
        "offset", F.expr(f"(CAST(key.id AS BIGINT) - {plan.keys}) div {partitions}")
    )
    records = confluent_records(
        envelopes, loaded["key_schema_id"], loaded["value_schema_id"], keep=("offset",)
    )
    kafka = records.select(
        "key",
        "value",
        F.lit(None).alias("headers"),
        F.lit(loaded["topic"] + ".snapshot").alias("topic"),
        "partition",
        "offset",
        F.lit(_SNAPSHOT_TS).cast("timestamp").alias("timestamp"),
    )
    flat, _ = flat_changes(config, kafka, loaded["value_schema"], loaded["value_schema_id"], ["id"])
    catalog = open_catalog(config)
    catalog.create_table(identifier, schema=schema, properties=dict(DEFAULT_TABLE_PROPERTIES))
    nullability = spark.conf.get("spark.sql.iceberg.check-nullability", "true")
    spark.conf.set(
        "spark.sql.iceberg.check-nullability", "false"
    )  # Spark's frame says nullable; no key is null
    try:
        flat.drop(*HELPER_COLUMNS).writeTo(f"{config.catalog.name}.{identifier}").append()
    finally:
        spark.conf.set("spark.sql.iceberg.check-nullability", nullability)
    template = catalog.load_table(identifier)
    return [task.file for task in template.scan().plan_files()]


def start_with(table: Table, files: list[DataFile]) -> None:
    """`table` (new, empty) gets `files` in one fast append: the table rows, by reference."""
    with table.transaction() as transaction:
        with transaction.update_snapshot().fast_append() as append:
            for data in files:
                append.append_data_file(data)
