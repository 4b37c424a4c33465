"""Which offsets the next batch reads, from what tables committed and what is still pending.

A restarted writer must neither skip records nor redo work the bookkeeper would commit twice,
so a table's next offset for a topic-partition is the latest of what the table committed, what
the writer's pending monikers for it already cover, and what the writer's checkpoint says it
finished (written after a batch's monikers are published and its dead letters sent; it moves on
a table that the batch gave no rows). The batch reads from the earliest of
the tables' starts, and each table keeps only rows at or after its own start.

Kafka can also be behind what was read: records lost to retention before a table got them (the
first retained offset is above the next to read) are counted in the plan, and a partition whose
end is below the next offset to read (the topic was deleted and recreated, or a broker lost
records) is named in the plan; the writer stops on it (`TopicReset`) rather than wait, unseen,
until the new topic's offsets pass the old ones and skip everything before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from icekeeper.common.moniker import Moniker

TopicPartition = tuple[str, int]

SMALLEST_TASK_RECORDS = 50_000
"""Both engines split a batch across more tasks than Kafka partitions only into pieces of at
least this many records (`records_per_task`): every task writes files of its own."""


@dataclass(frozen=True)
class PartitionBounds:
    """Kafka's current offsets of one topic-partition: first retained and next to be written."""

    earliest: int
    latest: int


class TopicReset(RuntimeError):
    """Kafka's end offset of a partition is below the next offset to read: the writer stops."""


@dataclass(frozen=True)
class BatchPlan:
    """Read range per topic-partition, and per table the offset each partition starts at."""

    read_ranges: dict[TopicPartition, tuple[int, int]]
    table_starts: dict[str, dict[TopicPartition, int]]
    lost_to_retention: dict[TopicPartition, int] = field(default_factory=dict)
    """Records Kafka's retention deleted before a table read them, per topic-partition."""
    behind_next: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)
    """Partitions whose end offset is below the next offset to read: (next offset, end offset)."""
    restarted: dict[str, set[TopicPartition]] = field(default_factory=dict)
    """Per table, partitions it starts over from the first offset of a recreated topic
    (`on_topic_reset: restart`); its moniker says so (`OffsetRange.topic_reset`)."""

    @property
    def records(self) -> int:
        return sum(until - start for start, until in self.read_ranges.values())

    def records_per_task(self, parallelism: int, smallest: int) -> int:
        """The most records one Spark task of this batch should read (see `records_per_task`)."""
        return records_per_task(self.records, parallelism, smallest)

    def table_range(self, table: str, topic_partition: TopicPartition) -> tuple[int, int] | None:
        """`[start, until)` of `table` in this batch, or None when it has nothing to read there."""
        if topic_partition not in self.read_ranges:
            return None
        start = self.table_starts.get(table, {}).get(
            topic_partition, self.read_ranges[topic_partition][0]
        )
        until = self.read_ranges[topic_partition][1]
        return (start, until) if until > start else None


def records_per_task(records: int, parallelism: int, smallest: int) -> int:
    """The most records one Spark task should read of a batch: two tasks per core when large.

    One task per Kafka partition leaves cores idle whenever partitions and cores do not divide
    (3 partitions on 2 cores run as two rounds, the second on one core: measured ~70% of the
    cores busy); pieces of at most a quarter of the batch on 2 cores keep both busy to the end.
    A batch is not cut below `smallest` records per task: every task writes files of its own.
    """
    return max(smallest, -(-records // (2 * max(1, parallelism))))


def pending_until(monikers: Iterable[Moniker]) -> dict[TopicPartition, int]:
    """Highest `until_offset` per topic-partition among pending monikers."""
    covered: dict[TopicPartition, int] = {}
    for moniker in monikers:
        for offsets in moniker.offsets:
            key = (offsets.topic, offsets.partition)
            covered[key] = max(covered.get(key, 0), offsets.until_offset)
    return covered


def pending_restarts(monikers: Iterable[Moniker]) -> dict[TopicPartition, int]:
    """Where pending monikers that start a recreated topic over have got to, per topic-partition:
    the highest `until_offset` of the newest such moniker and those after it. Until the bookkeeper
    commits them, these replace the table's committed offsets of the old topic."""
    restarts: dict[TopicPartition, int] = {}
    positions: dict[TopicPartition, int] = {}
    for moniker in sorted(monikers, key=lambda m: m.seq):
        for offsets in moniker.offsets:
            key = (offsets.topic, offsets.partition)
            if offsets.topic_reset:
                restarts[key] = moniker.seq
                positions[key] = offsets.until_offset
            elif key in restarts:
                positions[key] = max(positions[key], offsets.until_offset)
    return positions


def plan_batch(
    bounds: Mapping[TopicPartition, PartitionBounds],
    table_positions: Mapping[str, Mapping[TopicPartition, int]],
    default_start: str = "earliest",
    max_records: int | None = None,
    max_per_partition: int | None = None,
    on_topic_reset: Literal["stop", "restart"] = "stop",
) -> BatchPlan:
    """Plan the next batch.

    Args:
        bounds: Kafka's earliest/latest offsets of every topic-partition this writer reads.
        table_positions: per table, the next offset it needs per topic-partition (committed or
            pending, whichever is later); partitions a table has never seen are absent.
        default_start: where a table starts on a partition it has never seen (`earliest`/`latest`).
        max_records: cap on the whole batch, split across partitions in proportion to their lag.
        max_per_partition: cap per topic-partition.
        on_topic_reset: a table whose next offset is beyond a partition's end: `stop` names the
            partition in `behind_next`; `restart` starts the table over from the partition's
            first offset (in `restarted`).
    """
    table_starts: dict[str, dict[TopicPartition, int]] = {}
    lost: dict[TopicPartition, int] = {}
    behind: dict[TopicPartition, tuple[int, int]] = {}
    restarted: dict[str, set[TopicPartition]] = {}
    for table, positions in table_positions.items():
        starts = {}
        for topic_partition, bound in bounds.items():
            start = positions.get(topic_partition)
            if start is None:
                start = bound.earliest if default_start == "earliest" else bound.latest
            if start < bound.earliest:
                # Kafka's retention dropped records this table
                # never got: report, start at what exists.
                lost[topic_partition] = max(lost.get(topic_partition, 0), bound.earliest - start)
                start = bound.earliest
            if start > bound.latest and on_topic_reset == "restart":
                restarted.setdefault(table, set()).add(topic_partition)
                start = bound.earliest
            if start > bound.latest:
                behind[topic_partition] = (
                    max(start, behind.get(topic_partition, (0, 0))[0]),
                    bound.latest,
                )
            starts[topic_partition] = min(start, bound.latest)
        table_starts[table] = starts
    read_starts = (
        {tp: min(starts[tp] for starts in table_starts.values()) for tp in bounds}
        if table_starts
        else {}
    )
    lags = {
        tp: bounds[tp].latest - start
        for tp, start in read_starts.items()
        if bounds[tp].latest > start
    }
    caps = _split_cap(lags, max_records, max_per_partition)
    read_ranges = {tp: (read_starts[tp], read_starts[tp] + caps[tp]) for tp in lags if caps[tp] > 0}
    return BatchPlan(read_ranges, table_starts, lost, behind, restarted)


def _split_cap(
    lags: Mapping[TopicPartition, int], max_records: int | None, max_per_partition: int | None
) -> dict[TopicPartition, int]:
    caps = {
        tp: min(lag, max_per_partition) if max_per_partition else lag for tp, lag in lags.items()
    }
    total = sum(caps.values())
    if max_records is None or total <= max_records:
        return caps
    # Proportional to lag, as Spark's maxOffsetsPerTrigger does; every lagging partition moves.
    scaled = {tp: max(1, cap * max_records // total) for tp, cap in caps.items()}
    return {tp: min(caps[tp], cap) for tp, cap in scaled.items()}


def topic_reset_message(behind_next: Mapping[TopicPartition, tuple[int, int]]) -> str:
    """What the operator reads when the writer stops on
    partitions whose end is below the next offset."""
    named = ", ".join(
        f"{topic}:{partition} (next offset {next_offset}, Kafka's end {end})"
        for (topic, partition), (next_offset, end) in sorted(behind_next.items())
    )
    return (
        f"Kafka's end offset is below the next offset to read on {named}: the topic was deleted "
        "and recreated, or its records were lost. The writer stops instead of skipping the new "
        "records up to the old offsets (`sources[].on_topic_reset: restart` starts the tables over "
        "on the new topic); see docs/operations.md, 'A topic was deleted or recreated'."
    )
