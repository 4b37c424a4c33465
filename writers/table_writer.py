"""Write one table's rows of a batch as Parquet files, and the moniker that describes them.

A table's rows are the batch's records routed to it, decoded, and at or after the table's own
start (`KEEP`); they are flattened with the schema versions of the table's own records, written
into a batch folder of their own under the table's data location (claimed while it is filled, so
orphan removal leaves it alone), and listed with their sizes, record counts and partitions. The
moniker is returned, never published here: the batch publishes it once all its tables' files are
written and its dead letters sent.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from icekeeper.common.catalog import default_table_location, load_table_or_none, table_properties
from icekeeper.common.config.model import IcekeeperConfig, KafkaSource
from icekeeper.common.in_flight import InFlightClaims
from icekeeper.common.moniker import Moniker, OffsetRange, moniker_id
from icekeeper.common.partitioning import partition_spec
from icekeeper.common.schema import op_column
from icekeeper.writers import sql
from icekeeper.writers.columns import (
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
from icekeeper.writers.decode import DecodedBatch, VersionShape
from icekeeper.writers.files import (
    batch_folder,
    discard_output,
    list_written_files,
    parquet_write_options,
    partition_columns,
    write_parquet,
)
from icekeeper.writers.flatten import flatten, resolve_keys
from icekeeper.writers.offsets import BatchPlan
from icekeeper.writers.progress import TableProgress
from icekeeper.writers.routing import Routes
from icekeeper.writers.upserts import deleted_partition, last_change_per_key, split_deleted


@dataclass(frozen=True)
class RoutedBatch:
    """One source's batch, decoded and routed
    (`routing.routed_rows`): what each table is written from."""

    source: KafkaSource
    plan: BatchPlan
    seq: int
    decoded: DecodedBatch
    frame: DataFrame
    routes: Routes


@dataclass(frozen=True)
class TableWrite:
    """What writing one table's rows left behind."""

    moniker: Moniker | None
    """Describes the files; None when the table got no rows (its folder is already removed)."""
    output_dir: str
    """The batch folder, to discard if the batch is not published."""
    observed: dict
    """The counts observed while writing: the table's rows
    and event times, plus any batch counts asked for."""


class TableWriter:
    """Writes tables' rows of batches for one writer."""

    def __init__(
        self,
        config: IcekeeperConfig,
        catalog: Catalog,
        writer_id: str,
        claims: InFlightClaims,
        tables: dict[str, TableProgress],
    ) -> None:
        """
        Args:
            tables: the writer's progress per table: gives a moniker its `prev_seq`, and learns each
                table's bytes per row (which sizes its files).
        """
        self.config = config
        self.catalog = catalog
        self.writer_id = writer_id
        self.claims = claims
        self.tables = tables

    def write(
        self,
        batch: RoutedBatch,
        identifier: str,
        versions: list[VersionShape],
        batch_observations: list[Column] | None = None,
        route: str | None = None,
    ) -> TableWrite:
        """Write `identifier`'s rows of the batch; with
        `batch_observations`, also count the whole batch.

        The rows are the records of `route` (default: the table's own; see `Routes` for fan-out).

        The table's columns come from `versions`, the versions of its own records in this batch.

        The counts are taken on the flattened rows, in the one pass that writes the files: counting
        on the decoded records made Spark copy every nested Avro struct into a row of its own at
        that point (measured ~20% of the writer's CPU). Rows that are not this table's are nulled
        before flattening, so they cost little and can fail no conversion.
        """
        plan, decoded, frame = batch.plan, batch.decoded, batch.frame
        observes_batch = batch_observations is not None
        spec = self.config.table(identifier)
        table = load_table_or_none(self.catalog, identifier)
        keep = (
            f"{ROUTE} = {sql.string(route or identifier)} AND {ERROR} IS NULL AND "
            f"{at_or_after_sql(plan, identifier)}"
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
            versions,
            self.config.metadata_columns,
            table.metadata if table is not None else None,
            spec.primary_key,
            carry=[KEEP, ROUTE, VERSION],
        )
        schema: Schema = flat.schema
        spec_obj: PartitionSpec = (
            table.spec() if table is not None else partition_spec(spec.partition_by, schema)
        )
        partitions = partition_columns(spec_obj, schema)
        metrics = Observation(f"table-{uuid.uuid4().hex[:8]}")
        counts = [
            F.expr(f"count_if({KEEP})").alias("rows"),
            F.expr(f"min(CASE WHEN {KEEP} THEN {EVENT_MS} END)").alias("min_ms"),
            F.expr(f"max(CASE WHEN {KEEP} THEN {EVENT_MS} END)").alias("max_ms"),
        ]
        observed = flat.frame.observe(metrics, *counts, *(batch_observations or []))
        rows = observed.where(KEEP)
        if spec.upsert:
            op = op_column(self.config.metadata_columns)
            rows = last_change_per_key(rows, resolve_keys(schema.column_names, spec.primary_key))
            partitions = [
                deleted_partition(
                    op if op in schema.column_names else None,
                    hard_deletes=spec.delete_mode == "hard",
                ),
                *partitions,
            ]
        rows = rows.drop(*HELPER_COLUMNS, KEEP, ROUTE, VERSION)
        location = (
            table.location()
            if table is not None
            else default_table_location(self.config, identifier)
        )
        output = batch_folder(location, self.writer_id, batch.seq)
        progress = self.tables.setdefault(identifier, TableProgress())
        max_records = max(
            1000, int(self.config.writer.target_file_size_bytes / max(progress.bytes_per_row, 1.0))
        )
        self.claims.claim(location, output)
        write_parquet(
            rows,
            output,
            partitions,
            max_records,
            rebalance=self.config.writer.distribution == "rebalance",
            options=parquet_write_options(table_properties(table, spec)),
        )
        observed_rows = metrics.get
        rows_written = int(observed_rows.get("rows") or 0)
        files = list_written_files(output, partitions, spec_obj.spec_id) if rows_written else []
        files, deleted_keys = split_deleted(files) if spec.upsert else (files, [])
        if not files and not deleted_keys:
            discard_output([output])
            return TableWrite(None, output, observed_rows)
        written_bytes = sum(f.size_bytes for f in files + deleted_keys)
        progress.bytes_per_row = max(1.0, written_bytes / max(rows_written, 1))
        rows_written = sum(f.record_count for f in files)  # upsert tables: one row per key
        ranges = offset_ranges(plan, identifier)
        moniker = Moniker(
            id=moniker_id(self.writer_id, identifier, ranges),
            rereads_refused=True,
            writer_id=self.writer_id,
            seq=batch.seq,
            prev_seq=progress.last_seq,
            table=identifier,
            schema=json.loads(schema.model_dump_json()),
            files=files,
            delete_files=deleted_keys,
            offsets=ranges,
            records=rows_written,
            min_event_time_ms=observed_rows.get("min_ms"),
            max_event_time_ms=observed_rows.get("max_ms"),
            table_location=location,
        )
        return TableWrite(moniker, output, observed_rows)


def offset_only_monikers(
    catalog: Catalog,
    writer_id: str,
    plan: BatchPlan,
    seq: int,
    written: list[Moniker],
    tables: dict[str, TableProgress],
) -> list[Moniker]:
    """Monikers without files for the tables whose offsets must reach the table although they
    got no row of this batch (`written` has none of theirs):
    - a table that starts a partition over on a recreated topic: the restart is in the offsets,
      which the table's committed ones must take, else the next batch would find them beyond the
      partition's end and start over again;
    - a table that refused this writer's monikers (`TableProgress.rereading`): the writer read
      the refused offsets again, and the table must learn that it did, else every batch would
      read them again."""
    monikers = []
    rereading = {
        identifier
        for identifier in set(plan.table_starts) - {"*"}  # this source's tables only
        if identifier in tables and tables[identifier].rereading
    }
    for identifier in sorted(
        (set(plan.restarted) | rereading) - {m.table for m in written} - {"*"}
    ):
        table = load_table_or_none(catalog, identifier)
        ranges = offset_ranges(plan, identifier)
        if table is None or not ranges:
            continue  # nothing committed to start over from
        monikers.append(
            Moniker(
                id=moniker_id(writer_id, identifier, ranges),
                rereads_refused=True,
                writer_id=writer_id,
                seq=seq,
                prev_seq=tables.setdefault(identifier, TableProgress()).last_seq,
                table=identifier,
                schema=json.loads(table.schema().model_dump_json()),
                offsets=ranges,
                records=0,
                table_location=table.location(),
            )
        )
    return monikers


def offset_ranges(plan: BatchPlan, identifier: str) -> list[OffsetRange]:
    """The offsets a moniker of `identifier` covers:
    its own span of each partition the batch read."""
    return [
        OffsetRange(
            topic=topic,
            partition=partition,
            from_offset=start,
            until_offset=until,
            topic_reset=True if (topic, partition) in plan.restarted.get(identifier, ()) else None,
        )
        for (topic, partition) in sorted(plan.read_ranges)
        if (span := plan.table_range(identifier, (topic, partition))) is not None
        for start, until in [span]
    ]


def at_or_after_sql(plan: BatchPlan, identifier: str) -> str:
    """SQL keeping rows at or after the table's own start,
    where it differs from the batch's read start."""
    skipped = []
    for (topic, partition), (read_start, _) in plan.read_ranges.items():
        start = plan.table_starts.get(identifier, {}).get((topic, partition), read_start)
        if start > read_start:
            skipped.append(
                f"({KAFKA_TOPIC} = {sql.string(topic)} AND {KAFKA_PARTITION} = {partition} AND "
                f"{KAFKA_OFFSET} < {start})"
            )
    return f"NOT {sql.any_of(skipped)}" if skipped else "true"
