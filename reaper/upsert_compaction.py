"""Compaction of upsert tables: the reaper writes the compacted files, the bookkeeper commits them.

Iceberg's `rewrite_data_files` commits itself, and refuses to when a replaced file got position
deletes after the rewrite started. On an upsert table the bookkeeper adds such deletes every
cycle, so under steady updates that compaction never lands. Here the reaper picks the files,
reads their live rows as of one snapshot with Spark (deletes applied), writes them as new Parquet
files under the table's `data/` folder, and hands them over as a rewrite request
(`common/rewrites.py`); the bookkeeper commits it and deletes again whatever changed since.

Which files: in each partition, every file whose deleted share reaches `compact_delete_ratio`
or that has collected `MANY_DELETE_FILES` delete files (one per bookkeeper cycle that touched
it), plus the partition's small files (under 75% of the target size) when there are two or more.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyspark.sql import functions as F

from common.catalog import table_properties
from common.delete_files import deleted_positions_per_file
from common.locations import normalize_location
from common.parquet_files import (
    list_written_files,
    parquet_write_options,
    partition_columns,
    write_parquet,
)
from common.rewrites import (
    RewriteRequest,
    forget_refusal,
    is_pending,
    output_folder,
    publish_rewrite,
    refusal,
)
from common.storage import open_filesystem

log = logging.getLogger(__name__)

MANY_DELETE_FILES = 8
"""A data file with this many delete files is rewritten whatever its deleted share: every reader
opens all of them for it."""
PARQUET_FIELD_ID = "parquet.field.id"


@dataclass
class CompactionOutcome:
    """What one upsert compaction did: files handed over, and whether the bookkeeper took them."""

    files_replaced: int = 0
    files_written: int = 0
    committed: bool = False
    refused: str | None = None
    waiting: bool = False


def choose_files(
    table: Table, snapshot_id: int, target_bytes: int, delete_ratio: float
) -> list[DataFile]:
    """The data files of snapshot `snapshot_id` worth rewriting (see the module docstring)."""
    tasks = list(table.scan(snapshot_id=snapshot_id).plan_files())
    deleted = deleted_positions_per_file(
        {delete.file_path: delete for task in tasks for delete in task.delete_files}.values()
    )
    by_partition: dict[tuple, list] = defaultdict(list)
    for task in tasks:
        by_partition[(task.file.spec_id, tuple(task.file.partition))].append(task)
    chosen: list[DataFile] = []
    for partition_tasks in by_partition.values():
        worn = [
            task.file
            for task in partition_tasks
            if len(task.delete_files) >= MANY_DELETE_FILES
            or deleted.get(normalize_location(task.file.file_path), 0)
            >= delete_ratio * max(task.file.record_count, 1)
        ]
        worn_paths = {data.file_path for data in worn}
        small = [
            task.file
            for task in partition_tasks
            if task.file.file_size_in_bytes < 0.75 * target_bytes
            and task.file.file_path not in worn_paths
        ]
        chosen.extend(worn)
        if len(small) + len(worn) >= 2:
            chosen.extend(small)
    return chosen


class UpsertCompaction:
    """Writes compacted files of upsert tables with Spark and hands them to the bookkeeper."""

    def __init__(self, spark, catalog_name: str) -> None:  # noqa: ANN001 - a SparkSession
        self.spark = spark
        self.catalog_name = catalog_name

    def run(
        self, table: Table, identifier: str, target_bytes: int, delete_ratio: float, wait_s: float
    ) -> CompactionOutcome:
        """Write and hand over one compaction of `table`; wait up to `wait_s` for its commit."""
        outcome = CompactionOutcome()
        snapshot = table.refresh().current_snapshot()
        if snapshot is None:
            return outcome
        chosen = choose_files(table, snapshot.snapshot_id, target_bytes, delete_ratio)
        if not chosen:
            return outcome
        request_id = uuid.uuid4().hex
        output = output_folder(table.location(), request_id)
        if "://" not in output:
            output = "file://" + output
        schema = (
            table.schemas()[snapshot.schema_id]
            if snapshot.schema_id is not None
            else table.schema()
        )
        paths = [data.file_path for data in chosen]
        rows = (
            self.spark.read.format("iceberg")
            .option("versionAsOf", str(snapshot.snapshot_id))
            .load(f"{self.catalog_name}.{identifier}")
            .where(F.col("_file").isin(paths))
            .select(
                *[
                    F.col(f"`{field.name}`").alias(
                        field.name, metadata={PARQUET_FIELD_ID: field.field_id}
                    )
                    for field in schema.fields
                ]
            )
        )
        bytes_per_row = sum(data.file_size_in_bytes for data in chosen) / max(
            1, sum(data.record_count for data in chosen)
        )
        spec = table.spec()
        partitions = partition_columns(spec, schema)
        write_parquet(
            rows,
            output,
            partitions,
            max(1000, int(target_bytes / max(bytes_per_row, 1.0))),
            rebalance=True,
            options=parquet_write_options(table_properties(table, None)),
        )
        files = list_written_files(output, partitions, spec.spec_id)
        request = RewriteRequest(
            id=request_id,
            table=identifier,
            base_snapshot_id=snapshot.snapshot_id,
            replaced=paths,
            files=files,
            schema=schema.model_dump(mode="json", by_alias=True),
            output_folder=output,
        )
        publish_rewrite(table.location(), request)
        outcome.files_replaced, outcome.files_written = len(paths), len(files)
        log.info(
            "compaction handed to the bookkeeper",
            extra={
                "table": identifier,
                "request": request_id,
                "files_replaced": len(paths),
                "files_written": len(files),
                "base_snapshot_id": snapshot.snapshot_id,
            },
        )
        deadline = time.monotonic() + wait_s
        while is_pending(table.location(), request_id):
            if time.monotonic() >= deadline:
                outcome.waiting = True
                return outcome
            time.sleep(0.5)
        outcome.refused = refusal(table.location(), request_id)
        if outcome.refused is None:
            outcome.committed = True
            return outcome
        # Refused: nothing will ever commit these files, so they go
        # now (the refusal last, so a reaper that dies here finds it
        # again... or orphan removal takes the files after the grace).
        _delete_folder(output)
        forget_refusal(table.location(), request_id)
        return outcome


def _delete_folder(uri: str) -> None:
    filesystem, path = open_filesystem(uri)
    try:
        filesystem.delete_dir(path)
    except FileNotFoundError:
        pass
