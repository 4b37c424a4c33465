"""The arrow engine's tasks: a batch's offset ranges cut into pieces, one Spark task each.

The same cut as the `spark-sql` engine's Kafka source (`maxRecordsPerPartition`): a range is
split into pieces of roughly equal size, none larger than `BatchPlan.records_per_task`, so a
large batch runs as two tasks per core and both engines write the same files per piece.
Upsert batches group whole partitions instead (`TaskGroup`, `arrow_upserts.whole_partitions`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from icekeeper.writers.offsets import SMALLEST_TASK_RECORDS, BatchPlan


@dataclass(frozen=True)
class TaskRange:
    """One task's offsets: `[start, until)` of one topic-partition."""

    index: int
    topic: str
    partition: int
    start: int
    until: int

    @property
    def records(self) -> int:
        return self.until - self.start


@dataclass(frozen=True)
class TaskGroup:
    """One task reading several ranges, one after the other, and writing them as one: its files
    hold the rows of all its ranges (an upsert batch's whole partitions, `arrow_upserts.py`)."""

    index: int
    ranges: tuple[TaskRange, ...]

    @property
    def records(self) -> int:
        return sum(task.records for task in self.ranges)


def task_ranges(plan: BatchPlan, parallelism: int) -> list[TaskRange]:
    """The batch's read ranges cut into tasks, in topic-partition order, as Spark's
    `KafkaOffsetRangeCalculator` cuts them for the `spark-sql` engine (`maxRecordsPerPartition`,
    then `minPartitions` = the cores)."""
    most = plan.records_per_task(parallelism, SMALLEST_TASK_RECORDS)
    ranges = [
        (topic, partition, low, high)
        for (topic, partition), (start, until) in sorted(plan.read_ranges.items())
        if until > start
        for low, high in _divided(start, until, -(-(until - start) // most))
    ]
    if ranges and len(ranges) < parallelism:
        total = sum(high - low for _, _, low, high in ranges)
        ranges = [
            (topic, partition, low2, high2)
            for topic, partition, low, high in ranges
            for low2, high2 in _divided(
                low, high, max(1, math.floor((high - low) / total * parallelism + 0.5))
            )
        ]
    return [TaskRange(index, *piece) for index, piece in enumerate(ranges)]


def _divided(start: int, until: int, parts: int) -> list[tuple[int, int]]:
    """`[start, until)` in `parts` pieces, with Spark's arithmetic (a double part size)."""
    size = (until - start) / parts
    return [
        (start + int(size * part), until if part == parts - 1 else start + int(size * (part + 1)))
        for part in range(parts)
    ]
