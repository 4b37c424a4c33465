"""Compaction of upsert tables: the reaper writes the compacted files, the bookkeeper commits them.

Iceberg's `rewrite_data_files` commits itself, and refuses to when a replaced file got position
deletes after the rewrite started. On an upsert table the bookkeeper adds such deletes every
cycle, so under steady updates that compaction never lands. Here the reaper picks the files,
reads their live rows as of one snapshot with Spark (deletes applied), writes them as new Parquet
files under the table's `data/` folder, and hands them over as a rewrite request
(`common/rewrites.py`); the bookkeeper commits it and deletes again whatever changed since.

Which files: in each partition, every file whose deleted share reaches `compact_delete_ratio` or
that has collected `MANY_DELETE_FILES` delete files (the bookkeeper keeps one per data file, but
other engines' deletes, a Spark DELETE or MERGE, can leave many), plus every small file of the
partition (under 75% of the target size) when the chosen files would be two or more: a pass leaves
no small file of a partition beside its compacted ones. A file of 75% of the target or more that is
not worn stays as it is (rewriting it would not make fewer files).

How many files: the live rows of a partition's chosen files go to
ceil(live bytes / `compact_target_file_size_bytes`) files (at least one), the live bytes estimated
from the files' sizes less their deleted share (`plan_layout`). Spark would otherwise write one
file per read task (an unpartitioned table's rows were never shuffled), and Iceberg plans read
tasks for reading: each file with its delete files weighs at least 4 MB apiece, and adaptive split
sizes (`read.split.adaptive-size.enabled`, on by default) cut a small scan into at least as many
tasks as Spark has cores or shuffle partitions. The upsert bench's few MB came out as 13 files.
Here each partition gets write tasks of its own, as many as its files, and a row goes to one of
them by a hash of its file and position; a file is cut by record count only if a task got far more
rows than its share.

Waiting for the commit: only on a bookkeeper that is running, which it shows by holding the
group's lease (renewed every cycle). With none, the request is left for the bookkeeper's next
start at once (waiting `rewrite_wait` for nobody made `make demo` sit 5 minutes in silence); while
one runs, the wait logs its progress and ends as soon as the lease lapses.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from icekeeper.common.catalog import table_properties
from icekeeper.common.delete_files import deleted_positions_per_file
from icekeeper.common.fencing import LeaseRecord
from icekeeper.common.locations import normalize_location
from icekeeper.common.parquet_files import (
    list_written_files,
    parquet_write_options,
    partition_columns,
    write_parquet,
)
from icekeeper.common.rewrites import (
    RewriteRequest,
    commit_attempted,
    forget_refusal,
    is_pending,
    output_folder,
    publish_rewrite,
    refusal,
    set_aside_reason,
)
from icekeeper.common.storage import delete_folder

log = logging.getLogger(__name__)

MANY_DELETE_FILES = 8
"""A data file with this many delete files is rewritten whatever its deleted share: every reader
opens all of them for it."""
PARQUET_FIELD_ID = "parquet.field.id"
SMALL_SHARE = 0.75
"""A file under this share of the target size is small: merged with its partition's others."""
RECORDS_HEADROOM = 1.25
"""A write task cuts a file by record count only past this multiple of its expected rows (hash
shares vary a little; a file is not cut for that)."""
FILE_COLUMN, FIRST_TASK_COLUMN, FILES_COLUMN = "_ik_file", "_ik_first_task", "_ik_files"
TASK_COLUMN = "_ik_task"
"""Columns of the compaction's own while it lays rows out (none of them is written)."""
WAIT_POLL_S = 0.5
"""How often the wait for the bookkeeper looks at the request and at the bookkeeper's lease."""
WAIT_PROGRESS_EVERY_S = 10.0
"""How often a wait for the bookkeeper's commit logs that it still waits."""


@dataclass
class CompactionOutcome:
    """What one upsert compaction did: files handed over, and whether the bookkeeper took them."""

    files_replaced: int = 0
    files_written: int = 0
    committed: bool = False
    refused: str | None = None
    set_aside: str | None = None
    """Why the bookkeeper set the request aside (its files are kept for the operator)."""
    waiting: bool = False
    """Handed over and not committed yet: the bookkeeper commits it later."""
    no_bookkeeper: bool = False
    """Waiting because no bookkeeper was running (nobody held the group's lease)."""
    waited_s: float = 0.0


@dataclass(frozen=True)
class OutputLayout:
    """Where the live rows of the chosen files are written: the rows of a partition's files go to
    write tasks `first_task[path]` .. `first_task[path] + files[path] - 1`, one file each."""

    first_task: dict[str, int]
    files: dict[str, int]
    tasks: int
    max_records_per_file: int


def scan_files(table: Table, snapshot_id: int) -> tuple[list[FileScanTask], Counter[str]]:
    """The data files of snapshot `snapshot_id` with their delete files, and deleted rows per
    data file (normalized path)."""
    tasks = list(table.scan(snapshot_id=snapshot_id).plan_files())
    deleted = deleted_positions_per_file(
        {delete.file_path: delete for task in tasks for delete in task.delete_files}.values()
    )
    return tasks, deleted


def _partition_key(data: DataFile) -> tuple:
    return (data.spec_id, tuple(data.partition))


def _live_rows(data: DataFile, deleted: Counter[str]) -> int:
    return max(0, data.record_count - deleted.get(normalize_location(data.file_path), 0))


def choose_files(
    tasks: Iterable[FileScanTask], deleted: Counter[str], target_bytes: int, delete_ratio: float
) -> list[DataFile]:
    """The data files worth rewriting (see the module docstring)."""
    by_partition: dict[tuple, list[FileScanTask]] = defaultdict(list)
    for task in tasks:
        by_partition[_partition_key(task.file)].append(task)
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
            if task.file.file_size_in_bytes < SMALL_SHARE * target_bytes
            and task.file.file_path not in worn_paths
        ]
        chosen.extend(worn)
        if len(small) + len(worn) >= 2:
            chosen.extend(small)
    return chosen


def plan_layout(chosen: list[DataFile], deleted: Counter[str], target_bytes: int) -> OutputLayout:
    """How many files each partition's live rows go to, and which write tasks write them (see the
    module docstring). A partition with no live row gets no task: its files just leave."""
    by_partition: dict[tuple, list[DataFile]] = defaultdict(list)
    for data in chosen:
        by_partition[_partition_key(data)].append(data)
    first_task: dict[str, int] = {}
    files: dict[str, int] = {}
    tasks, most_rows_per_file = 0, 0
    for partition_files in by_partition.values():
        live_rows = sum(_live_rows(data, deleted) for data in partition_files)
        if live_rows == 0:
            continue
        live_bytes = sum(
            data.file_size_in_bytes * _live_rows(data, deleted) / max(data.record_count, 1)
            for data in partition_files
        )
        partition_files_out = max(1, math.ceil(live_bytes / target_bytes))
        for data in partition_files:
            first_task[data.file_path], files[data.file_path] = tasks, partition_files_out
        tasks += partition_files_out
        most_rows_per_file = max(most_rows_per_file, math.ceil(live_rows / partition_files_out))
    return OutputLayout(
        first_task=first_task,
        files=files,
        tasks=tasks,
        max_records_per_file=max(1000, math.ceil(RECORDS_HEADROOM * most_rows_per_file)),
    )


class UpsertCompaction:
    """Writes compacted files of upsert tables with Spark and hands them to the bookkeeper."""

    def __init__(self, spark, catalog_name: str) -> None:  # noqa: ANN001 - a SparkSession
        self.spark = spark
        self.catalog_name = catalog_name

    def run(
        self,
        table: Table,
        identifier: str,
        target_bytes: int,
        delete_ratio: float,
        wait_s: float,
        bookkeeper_lease: Callable[[], LeaseRecord | None],
    ) -> CompactionOutcome:
        """Write and hand over one compaction of `table`; wait up to `wait_s` for its commit while
        `bookkeeper_lease` says the group's bookkeeper is running (its live lease, or None)."""
        outcome = CompactionOutcome()
        snapshot = table.refresh().current_snapshot()
        if snapshot is None:
            return outcome
        scan_tasks, deleted = scan_files(table, snapshot.snapshot_id)
        chosen = choose_files(scan_tasks, deleted, target_bytes, delete_ratio)
        if not chosen:
            return outcome
        layout = plan_layout(chosen, deleted, target_bytes)
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
        spec = table.spec()
        partitions = partition_columns(spec, schema)
        if layout.tasks:
            write_parquet(
                self._laid_out_rows(identifier, snapshot.snapshot_id, schema, paths, layout),
                output,
                partitions,
                layout.max_records_per_file,
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
        if not wait_for_commit(
            table.location(), identifier, request_id, wait_s, bookkeeper_lease, outcome
        ):
            outcome.waiting = True
            return outcome
        outcome.refused = refusal(table.location(), request_id)
        if outcome.refused is None:
            outcome.set_aside = set_aside_reason(table.location(), request_id)
            outcome.committed = outcome.set_aside is None
            return outcome
        # Refused: nothing will ever commit these files, so they go
        # now (the refusal last, so a reaper that dies here finds it
        # again... or orphan removal takes the files after the grace).
        # Unless a commit of it was attempted: it may have landed in a
        # snapshot since expired, and orphan removal knows what any
        # snapshot still names.
        if not commit_attempted(table.location(), request_id):
            delete_folder(output)
        forget_refusal(table.location(), request_id)
        return outcome

    def _laid_out_rows(
        self,
        identifier: str,
        snapshot_id: int,
        schema: Schema,
        paths: list[str],
        layout: OutputLayout,
    ) -> DataFrame:
        """The live rows of files `paths` as of `snapshot_id` (deletes applied), in the write
        tasks `layout` gives them: a hash of the row's file and position picks one of its
        partition's tasks."""
        tasks_of_files = self.spark.createDataFrame(
            [(path, layout.first_task[path], layout.files[path]) for path in layout.first_task],
            f"{FILE_COLUMN} string, {FIRST_TASK_COLUMN} int, {FILES_COLUMN} int",
        )
        return (
            self.spark.read.format("iceberg")
            .option("versionAsOf", str(snapshot_id))
            .load(f"{self.catalog_name}.{identifier}")
            .where(F.col("_file").isin(paths))
            # Metadata columns: named, since `*` and a join's USING leave them out.
            .select("*", "_file", "_pos")
            .join(F.broadcast(tasks_of_files), F.col("_file") == F.col(FILE_COLUMN))
            .withColumn(
                TASK_COLUMN,
                F.col(FIRST_TASK_COLUMN) + F.pmod(F.xxhash64("_file", "_pos"), F.col(FILES_COLUMN)),
            )
            # A given number of partitions: adaptive execution neither merges nor splits them.
            .repartition(layout.tasks, TASK_COLUMN)
            .select(
                *[
                    F.col(f"`{field.name}`").alias(
                        field.name, metadata={PARQUET_FIELD_ID: field.field_id}
                    )
                    for field in schema.fields
                ]
            )
        )


def wait_for_commit(
    location: str,
    identifier: str,
    request_id: str,
    wait_s: float,
    bookkeeper_lease: Callable[[], LeaseRecord | None],
    outcome: CompactionOutcome,
) -> bool:
    """Until the bookkeeper commits or refuses request `request_id` (True), for at most
    `wait_s` and only while a bookkeeper holds the lease (False: the request stays pending
    for the bookkeeper to commit when it runs)."""
    started = time.monotonic()
    progress_at = started
    while is_pending(location, request_id):
        outcome.waited_s = round(time.monotonic() - started, 1)
        holder = bookkeeper_lease()
        if holder is None:
            if not is_pending(location, request_id):
                break  # committed (or refused) just before its bookkeeper stopped
            outcome.no_bookkeeper = True
            return False
        if time.monotonic() - started >= wait_s:
            return False
        if time.monotonic() >= progress_at:
            log.info(
                "waiting for the bookkeeper to commit the compaction",
                extra={
                    "table": identifier,
                    "request": request_id,
                    "bookkeeper": holder.owner,
                    "epoch": holder.epoch,
                    "waited_s": outcome.waited_s,
                    "wait_at_most_s": wait_s,
                },
            )
            progress_at += WAIT_PROGRESS_EVERY_S
        time.sleep(WAIT_POLL_S)
    outcome.waited_s = round(time.monotonic() - started, 1)
    return True
