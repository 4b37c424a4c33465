"""Upsert tables on the arrow engine: each task keeps the last change of each key it read.

The same rule as the `spark-sql` engine (`spark_sql_engine/sql_upserts.py`): within a batch, a key's
last change in Kafka offset order wins; its row goes to the table's data files unless that change is
a delete (op `d`) in `delete_mode: hard`, when the row goes to a deleted-keys file instead (which
the bookkeeper turns into position deletes of the key's earlier row). Both kinds of file are laid
out as `spark-sql` lays them out, under `_ik_deleted=false/` and `_ik_deleted=true/` folders of the
batch, above the table's own partition folders.

Keys split across tasks. A task sees only its own records, so two tasks holding one key would
both write a row for it. Choice (correctness first; a key in two partitions is rare, so its cost
matters little):
- An upsert batch runs as at most one task per core (`whole_partitions`), each taking whole Kafka
  partitions, never a partition cut in pieces: Debezium keys records by primary key, so a key's
  changes share a partition and one task sees all of them, in offset order. Partitions go
  largest first to the least loaded task, so the tasks' record counts stay close. What fewer
  tasks buy is fewer files: a task writes one data file per table partition and one
  deleted-keys file, and the bookkeeper a position-delete file per data file it touches.
  `icekeeper bench upsert`'s 200k-record batches over 4 partitions on 2 cores ran as 4 tasks
  (4 data and 4 deleted-keys files a batch), 2 now. Not time: two 50k-record ranges run as one
  task or as two, one after the other in one process, took 0.52 s either way (medians of ten).
- A key can still appear in two partitions (a topic repartitioned, a producer keying otherwise).
  Within a task, the dedup's group_by also takes the lowest and highest range of each key
  (`LastChanges.keys_in_two_ranges`): no offset orders two partitions' changes (2 ms more
  than the 12 ms group_by of 200k rows over 100k keys in two ranges, best of 21). Between tasks,
  each task returns the 64-bit hashes of the keys it wrote (`key_hashes`); the driver checks the
  tasks' sets for overlap (`shared_key_count`, one sort of the batch's hashes in the driver, only
  when a batch has several tasks). Either way the driver discards the arrow output and runs the
  batch on `spark-sql`, which orders such a key by offset alone. A hash collision between two
  different keys costs that fallback, never a wrong row.
- Rejected: fixing up the overlap in the driver (the earlier task's row of a shared key would
  have to be removed from its files, which means rewriting them), for a case that happens only
  after a repartitioning; and a shuffle of the rows by key (`spark-sql`'s window), which would
  send rows between tasks where the arrow engine's tasks return only file facts.

Per-key dedup (one task's rows, in offset order): pyarrow's `group_by(keys).aggregate(max row
number)` then `take`. For 200k rows over 100k int keys (best of 21, 2 cores at load 3 to 6): 12-15
ms, against 13-18 ms for polars' `group_by` (Arrow conversion included), 19-21 ms for polars'
`unique(keep="last")` and 30-57 ms for a sort by (key, row) with a numpy mask. The two group_bys
are within the noise of this shared machine; pyarrow's takes every Arrow type as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from icekeeper.writers.arrow_engine.task_ranges import TaskGroup, TaskRange
from icekeeper.writers.key_columns import UpsertRule

_ROW = "_ik_row"
_RANGE = "_ik_range"


@dataclass(frozen=True)
class LastChanges:
    """A task's rows of an upsert table after dedup."""

    live: pa.Table
    """Rows of keys whose last change keeps a row (data files)."""
    deleted: pa.Table
    """Rows of keys whose last change deletes them (deleted-keys files)."""
    keys_in_two_ranges: int = 0
    """Keys with changes in two of the task's Kafka ranges: their order is unknown, and the
    batch must run on `spark-sql` (see the module docstring)."""


def last_change_per_key(rows: pa.Table, key_columns: tuple[str, ...]) -> pa.Table:
    """The last row of each key of `rows` (which are in Kafka offset order), in that order."""
    return rows.take(_last_rows(rows, key_columns, None)[0])


def _last_rows(
    rows: pa.Table, key_columns: tuple[str, ...], ranges: pa.Array | None
) -> tuple[np.ndarray, int]:
    """Positions of each key's last row, ascending, and how many keys have rows of two `ranges`
    (each row's range in the task; None: one range)."""
    if rows.num_rows == 0:
        return np.empty(0, np.int64), 0
    numbered = rows.select(list(key_columns)).append_column(
        _ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64))
    )
    aggregates = [(_ROW, "max")]
    if ranges is not None:
        numbered = numbered.append_column(_RANGE, ranges)
        aggregates += [(_RANGE, "min"), (_RANGE, "max")]
    last = numbered.group_by(list(key_columns), use_threads=False).aggregate(aggregates)
    shared = 0
    if ranges is not None:
        low, high = last.column(f"{_RANGE}_min"), last.column(f"{_RANGE}_max")
        shared = pc.sum(pc.not_equal(low, high)).as_py() or 0
    return np.sort(last.column(f"{_ROW}_max").to_numpy()), shared


def last_changes(rows: pa.Table, plan: UpsertRule, ranges: pa.Array | None = None) -> LastChanges:
    """`rows` (one task's, in offset order within each of its Kafka ranges) reduced to each key's
    last change, split by whether it deletes the key. `ranges`: each row's range in the task,
    when it has several (`LastChanges.keys_in_two_ranges` counts the keys found in two)."""
    positions, shared = _last_rows(rows, plan.key_columns, ranges)
    latest = rows.take(positions)
    if plan.op_column is None or plan.op_column not in latest.column_names:
        return LastChanges(latest, latest.slice(0, 0), shared)
    deletes = pc.fill_null(pc.equal(latest.column(plan.op_column), "d"), False)
    return LastChanges(latest.filter(pc.invert(deletes)), latest.filter(deletes), shared)


def key_hashes(rows: pa.Table, key_columns: tuple[str, ...]) -> np.ndarray:
    """64-bit hashes of the keys of `rows` (one row per key, after `last_changes`), in row order:
    polars' row hash with a fixed seed, the same in every executor running the same polars
    version. Not made distinct here: that sort cost ~70 ms per 86k keys, the hash 0.2 ms."""
    if rows.num_rows == 0:
        return np.empty(0, np.uint64)
    keys = pl.from_arrow(rows.select(list(key_columns)))
    assert isinstance(keys, pl.DataFrame)
    return keys.hash_rows(seed=0).to_numpy()


def shared_key_count(task_hashes: list[np.ndarray]) -> int:
    """How many key hashes occur twice among the tasks' hashes (each task's keys are distinct,
    so a repeat is a key in two tasks, or a 64-bit collision that costs a needless fallback)."""
    sets = [hashes for hashes in task_hashes if len(hashes)]
    if len(sets) < 2:
        return 0
    every = np.sort(np.concatenate(sets))
    return int(np.count_nonzero(every[1:] == every[:-1]))


def per_partition(tasks: list[TaskRange]) -> list[TaskRange]:
    """`tasks` with each Kafka partition's pieces joined back into one task (see the module
    docstring), renumbered in order."""
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for task in tasks:
        key = (task.topic, task.partition)
        low, high = spans.get(key, (task.start, task.until))
        spans[key] = (min(low, task.start), max(high, task.until))
    return [
        TaskRange(index, topic, partition, start, until)
        for index, ((topic, partition), (start, until)) in enumerate(spans.items())
    ]


def whole_partitions(tasks: list[TaskRange], parallelism: int) -> list[TaskGroup]:
    """`tasks`' Kafka partitions, each whole, in at most `parallelism` tasks balanced by record
    count: largest partition first into the task with the fewest records so far (ties: the
    lower topic-partition, the lower task), each task's ranges in topic-partition order."""
    spans = per_partition(tasks)
    count = max(1, min(parallelism, len(spans)))
    groups: list[list[TaskRange]] = [[] for _ in range(count)]
    loads = [0] * count
    for span in sorted(spans, key=lambda s: (-s.records, s.topic, s.partition)):
        least = min(range(count), key=lambda index: (loads[index], index))
        groups[least].append(span)
        loads[least] += span.records
    return [
        TaskGroup(
            index,
            tuple(
                TaskRange(index, s.topic, s.partition, s.start, s.until)
                for s in sorted(group, key=lambda s: (s.topic, s.partition))
            ),
        )
        for index, group in enumerate(group for group in groups if group)
    ]
