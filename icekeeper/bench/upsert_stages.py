"""Where an upsert batch's time goes: one batch of
the topic through growing prefixes of the pipeline.

The writer's own pieces, one Spark job per prefix, no icekeeper bookkeeping around them: the Kafka
read alone; + decoding and flattening (Spark's `noop` sink); + Parquet (what a changelog batch
writes); + the last change per key (`spark_sql_engine/sql_upserts.py`, a shuffle by key); + Parquet
laid out by the deleted flag (what an upsert batch writes). Each prefix runs `repeat` times over the
first `batch_records` records of the topic, in turns; the medians' differences say what upsert adds
to a batch over the changelog path, on the same cores as the timed runs.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from icekeeper.bench.upsert_merge import flat_changes
from icekeeper.common.catalog import DEFAULT_TABLE_PROPERTIES
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.parquet_files import parquet_write_options, write_parquet
from icekeeper.common.schema import op_column
from icekeeper.writers.spark_sql_engine.columns import HELPER_COLUMNS
from icekeeper.writers.spark_sql_engine.sql_upserts import deleted_partition, last_change_per_key


def measure_upsert_stages(
    spark: SparkSession,
    config: IcekeeperConfig,
    loaded: dict,
    batch_records: int,
    key_columns: list[str],
    folder: Path,
    repeat: int = 3,
) -> dict[str, float]:
    """Median seconds of each prefix over one batch
    (`loaded`: what `upsert_data.preload` reported)."""
    topic = loaded["topic"]
    per_partition = max(1, batch_records // len(loaded["partition_records"]))
    ending = json.dumps(
        {
            topic: {
                str(partition): min(per_partition, records)
                for partition, records in enumerate(loaded["partition_records"])
            }
        }
    )

    def kafka() -> DataFrame:
        return (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", config.sources[0].bootstrap_servers)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", ending)
            .option("minPartitions", str(spark.sparkContext.defaultParallelism))
            .load()
        )

    def flat() -> DataFrame:
        return flat_changes(
            config, kafka(), loaded["value_schema"], loaded["value_schema_id"], key_columns
        )[0]

    options = parquet_write_options(DEFAULT_TABLE_PROPERTIES)
    deleted = deleted_partition(op_column(config.metadata_columns))

    def parquet(rows: DataFrame, by_deleted: bool) -> None:
        write_parquet(
            rows.drop(*HELPER_COLUMNS),
            str(folder / uuid.uuid4().hex),
            [deleted] if by_deleted else [],
            10_000_000,
            options=options,
        )

    stages: dict[str, Callable[[], object]] = {
        "read": lambda: kafka().selectExpr("sum(length(value))").collect(),
        "read_decode_flatten": lambda: flat().write.format("noop").mode("overwrite").save(),
        "read_decode_flatten_parquet": lambda: parquet(flat(), by_deleted=False),
        "read_decode_flatten_last_per_key": lambda: (
            last_change_per_key(flat(), key_columns).write.format("noop").mode("overwrite").save()
        ),
        "read_decode_flatten_last_per_key_parquet_by_deleted": lambda: parquet(
            last_change_per_key(flat(), key_columns), by_deleted=True
        ),
    }
    seconds: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(repeat):
        for name, action in stages.items():
            started = time.monotonic()
            action()
            seconds[name].append(time.monotonic() - started)
    return {name: round(statistics.median(values), 2) for name, values in seconds.items()}
