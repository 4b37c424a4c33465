"""Which mostly-deleted data files of an upsert table the bookkeeper purges after a commit.

Every writer batch writes each key's last change as a new row, and the next batches update most of
those keys again: an older data file ends up mostly position-deleted, and every reader (DuckDB,
Spark, pyiceberg) still reads its dead rows to drop them. In `icekeeper bench upsert` the table
held 279k rows of which 179k were deleted, and a DuckDB scan took 2.5x the same live rows written
once. The reaper's compaction fixes that at its next pass; between passes, the bookkeeper, which
knows from its key index how many rows of each file are live, copies the live rows of files whose
deleted share reached `bookkeeper.purge_deleted_share` into new files (`purges.py`).

Plain values in, a plan out, no I/O: what the index and the snapshot's manifests say of each file
is gathered by the caller.

- A file qualifies once `deleted_share` of its rows are deleted and it is at most `max_file_bytes`
  (bigger files are the reaper's: copying them would stall a cycle).
- A file with no live row leaves without a new file and costs no budget (nothing is read).
- The others go most-deleted first while the bytes read stay within `budget_bytes`; a file that
  does not fit waits for a later cycle (`deferred`), smaller ones after it may still go.
- The chosen files of one partition (spec id and partition values) go to one new file, cut where
  its estimated size (each file's bytes times its live share) would pass `max_file_bytes`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

PLAIN_PARTITION_VALUES = (type(None), bool, int, float, str)
"""Partition values a rewrite request carries as JSON (what the writers partition by); a file with
another kind (decimal, uuid, binary identity partitions) is left to the reaper."""


@dataclass(frozen=True)
class FileLiveness:
    """One live data file of the table's current snapshot and how much of it is still live."""

    path: str
    spec_id: int
    partition: tuple
    record_count: int
    size_bytes: int
    live_rows: int

    @property
    def deleted_share(self) -> float:
        return 1.0 - self.live_rows / self.record_count if self.record_count else 0.0

    @property
    def live_bytes(self) -> float:
        """The file's bytes times its live share: about what its live rows take in a new file."""
        return self.size_bytes * (1.0 - self.deleted_share)


@dataclass(frozen=True)
class PurgeGroup:
    """Data files of one partition whose live rows go to one new file."""

    spec_id: int
    partition: tuple
    files: tuple[FileLiveness, ...]

    @property
    def live_rows(self) -> int:
        return sum(file.live_rows for file in self.files)


@dataclass(frozen=True)
class PurgePlan:
    """What one cycle purges: groups copied to new files, files that just leave, files that wait."""

    groups: tuple[PurgeGroup, ...] = ()
    emptied: tuple[FileLiveness, ...] = ()
    """Files with no live row: removed, no new file."""
    deferred: int = 0
    """Files that qualify but did not fit this cycle's budget."""

    @property
    def replaced(self) -> list[FileLiveness]:
        return [file for group in self.groups for file in group.files] + list(self.emptied)

    @property
    def bytes_read(self) -> int:
        return sum(file.size_bytes for group in self.groups for file in group.files)

    def __bool__(self) -> bool:
        return bool(self.groups or self.emptied)


def plan_purge(
    files: Iterable[FileLiveness], deleted_share: float, max_file_bytes: int, budget_bytes: int
) -> PurgePlan:
    """The files to purge this cycle (see the module docstring); nothing when `deleted_share` is 0.

    Args:
        files: the table's live data files with their live rows (files the index knows nothing of
            are best left out by the caller).
        deleted_share: share of deleted rows from which a file is purged (0: never).
        max_file_bytes: largest file purged, and the cut size of the new files.
        budget_bytes: bytes of files read in one cycle.
    """
    if deleted_share <= 0:
        return PurgePlan()
    worn = [
        file
        for file in files
        if 0 < file.record_count
        and 0 <= file.live_rows <= file.record_count
        and file.deleted_share >= deleted_share
        and file.size_bytes <= max_file_bytes
        and all(isinstance(value, PLAIN_PARTITION_VALUES) for value in file.partition)
    ]
    emptied = tuple(sorted((file for file in worn if file.live_rows == 0), key=lambda f: f.path))
    taken: list[FileLiveness] = []
    spent = deferred = 0
    for file in sorted(
        (file for file in worn if file.live_rows > 0),
        key=lambda file: (-file.deleted_share, file.path),
    ):
        if spent + file.size_bytes > budget_bytes:
            deferred += 1
            continue
        taken.append(file)
        spent += file.size_bytes
    return PurgePlan(_grouped(taken, max_file_bytes), emptied, deferred)


def _grouped(taken: list[FileLiveness], max_file_bytes: int) -> tuple[PurgeGroup, ...]:
    """`taken` by partition, each partition's cut into runs whose live bytes fit one new file."""
    by_partition: dict[tuple[int, tuple], list[FileLiveness]] = defaultdict(list)
    for file in taken:
        by_partition[(file.spec_id, file.partition)].append(file)
    groups = []
    for (spec_id, partition), partition_files in by_partition.items():
        run: list[FileLiveness] = []
        run_bytes = 0.0
        for file in sorted(partition_files, key=lambda f: f.path):
            if run and run_bytes + file.live_bytes > max_file_bytes:
                groups.append(PurgeGroup(spec_id, partition, tuple(run)))
                run, run_bytes = [], 0.0
            run.append(file)
            run_bytes += file.live_bytes
        groups.append(PurgeGroup(spec_id, partition, tuple(run)))
    return tuple(groups)
