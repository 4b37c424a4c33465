"""Write one table's rows of a batch as Parquet files with Spark SQL (`spark-sql`).

A table's rows are the batch's records routed to it, decoded, and at or after the table's own
start (`KEEP`); they are flattened with the schema versions of the table's own records
(`sql_flatten.py`, into the schema the table's plan gives: `writers/table_batch.py`), written
into the plan's batch folder, and listed with their sizes, record counts and partitions: the
file facts the batch's moniker is built from.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from icekeeper.common.config.model import IcekeeperConfig, KafkaSource
from icekeeper.common.parquet_files import (
    list_written_files,
    parquet_write_options,
    partition_columns,
    write_parquet,
)
from icekeeper.writers.offsets import BatchPlan
from icekeeper.writers.offsets import TopicPartition as TP
from icekeeper.writers.routing import Routes
from icekeeper.writers.spark_sql_engine import sql
from icekeeper.writers.spark_sql_engine.columns import (
    ERROR,
    EVENT_MS,
    HELPER_COLUMNS,
    KAFKA_OFFSET,
    KAFKA_PARTITION,
    KAFKA_TOPIC,
    KEEP,
    ROUTE,
    VERSION,
)
from icekeeper.writers.spark_sql_engine.decoding import DecodedBatch
from icekeeper.writers.spark_sql_engine.sql_flatten import flatten
from icekeeper.writers.spark_sql_engine.sql_upserts import (
    deleted_partition,
    last_change_per_key,
    split_deleted,
)
from icekeeper.writers.table_batch import TableBatch, TableFiles


@dataclass(frozen=True)
class RoutedBatch:
    """One source's batch, decoded and routed
    (`sql_routing.routed_rows`): what each table is written from."""

    source: KafkaSource
    plan: BatchPlan
    seq: int
    decoded: DecodedBatch
    frame: DataFrame
    routes: Routes


@dataclass(frozen=True)
class TableWrite:
    """What writing one table's rows left behind."""

    files: TableFiles
    """The files (none when the table got no rows)."""
    observed: dict
    """The counts observed while writing: the table's rows
    and event times, plus any batch counts asked for."""


class TableWriter:
    """Writes tables' rows of batches."""

    def __init__(self, config: IcekeeperConfig) -> None:
        self.config = config

    def write(
        self,
        batch: RoutedBatch,
        table: TableBatch,
        batch_observations: list[Column] | None = None,
    ) -> TableWrite:
        """Write the rows of `table`'s route (the table's own, or the first table claiming alike:
        `Routes` fan-out) into its batch folder; with `batch_observations`, also count the whole
        batch.

        The counts are taken on the flattened rows, in the one pass that writes the files: counting
        on the decoded records made Spark copy every nested Avro struct into a row of its own at
        that point (measured ~20% of the writer's CPU). Rows that are not this table's are nulled
        before flattening, so they cost little and can fail no conversion.
        """
        decoded, frame = batch.decoded, batch.frame
        observes_batch = batch_observations is not None
        keep = (
            f"{ROUTE} = {sql.string(table.route)} AND {ERROR} IS NULL AND "
            f"{at_or_after_sql(table.starts)}"
        )
        if not observes_batch:
            frame = frame.where(keep)
        frame = frame.selectExpr("*", f"{keep} AS {KEEP}")
        frame = frame.withColumns(
            {
                v.column: F.expr(f"CASE WHEN {KEEP} THEN {sql.ident(v.column)} END")
                for v in decoded.versions
            }
        )
        flat = flatten(
            frame,
            list(table.versions),
            self.config.metadata_columns,
            table.schema,
            carry=[KEEP, ROUTE, VERSION],
        )
        partitions = partition_columns(table.partition_spec, table.schema)
        metrics = Observation(f"table-{uuid.uuid4().hex[:8]}")
        counts = [
            F.expr(f"count_if({KEEP})").alias("rows"),
            F.expr(f"min(CASE WHEN {KEEP} THEN {EVENT_MS} END)").alias("min_ms"),
            F.expr(f"max(CASE WHEN {KEEP} THEN {EVENT_MS} END)").alias("max_ms"),
        ]
        observed = flat.frame.observe(metrics, *counts, *(batch_observations or []))
        rows = observed.where(KEEP)
        if table.upsert is not None:
            rows = last_change_per_key(rows, list(table.upsert.key_columns))
            partitions = [deleted_partition(table.upsert.op_column), *partitions]
        rows = rows.drop(*HELPER_COLUMNS, KEEP, ROUTE, VERSION)
        write_parquet(
            rows,
            table.output_uri,
            partitions,
            table.max_records_per_file,
            rebalance=self.config.writer.distribution == "rebalance",
            options=parquet_write_options(table.properties),
        )
        observed_rows = metrics.get
        rows_written = int(observed_rows.get("rows") or 0)
        files = (
            list_written_files(table.output_uri, partitions, table.partition_spec.spec_id)
            if rows_written
            else []
        )
        files, deleted_keys = split_deleted(files) if table.upsert is not None else (files, [])
        return TableWrite(
            TableFiles(
                files,
                deleted_keys,
                rows_written,
                observed_rows.get("min_ms"),
                observed_rows.get("max_ms"),
            ),
            observed_rows,
        )


def at_or_after_sql(starts: dict[TP, int]) -> str:
    """SQL keeping rows at or after a table's own start, where it lies past the batch's read
    start (`TableBatch.starts`)."""
    skipped = [
        f"({KAFKA_TOPIC} = {sql.string(topic)} AND {KAFKA_PARTITION} = {partition} AND "
        f"{KAFKA_OFFSET} < {start})"
        for (topic, partition), start in starts.items()
    ]
    return f"NOT {sql.any_of(skipped)}" if skipped else "true"
