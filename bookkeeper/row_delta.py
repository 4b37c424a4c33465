"""The upsert row delta: what a commit to an upsert table adds beside its rows.

An upsert table keeps one live row per key. A commit that adds rows (a cycle's monikers, Event
Grid's files) also position-deletes the rows their keys replace, as Iceberg's `RowDelta` adds
data and deletes in one snapshot: the key index (`table_key_indexes.py`) says which rows those
are. The new delete files take over the positions of each data file's earlier live delete file,
which leaves with the same snapshot (`live_deletes.py`). Once the commit is durable the index
points the keys at their new rows; a lost compare-and-swap leaves it as it was (it is planned
again on the refreshed table).

Keys are read from the added files (only the key columns). An addition whose key columns storage
cannot serve now waits, and with it its writer's later monikers (a key's changes commit in
order); one whose key columns cannot be read is quarantined like one with an invalid file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from icekeeper.bookkeeper.commit_path import SnapshotChanges, TableCommit
from icekeeper.bookkeeper.datafiles import FileUnavailable, InvalidFile
from icekeeper.bookkeeper.table_key_indexes import MonikerKeys, TableKeyIndexes, UpsertCycle
from icekeeper.common.moniker import FileEntry
from icekeeper.common.transports.base import Delivery


@dataclass
class Addition:
    """One delivery's files as a commit adds them."""

    delivery: Delivery
    data_files: list[DataFile]
    deleted_keys: list[FileEntry] = field(default_factory=list)
    """A writer's deleted-keys files: every key in them is deleted."""


@dataclass
class HeldBack:
    """The additions a row delta keeps out of its commit, and why."""

    quarantined: list[tuple[Delivery, str]] = field(default_factory=list)
    waiting: list[Delivery] = field(default_factory=list)
    unavailable: list[tuple[Delivery, str]] = field(default_factory=list)
    """Those waiting because storage could not serve a file (also in `waiting`)."""
    writers: dict[str, int] = field(default_factory=dict)
    """Writer -> the seq of its first waiting moniker: its later monikers wait behind it."""

    def deliveries(self) -> set[int]:
        """`id()`s of the deliveries held back."""
        return {id(d) for d in self.waiting} | {id(d) for d, _ in self.quarantined}


class RowDelta:
    """The position deletes of one commit to an upsert table, planned again in every attempt."""

    def __init__(self, key_indexes: TableKeyIndexes) -> None:
        self.key_indexes = key_indexes
        self._cycle: UpsertCycle | None = None

    def plan(self, table: Table, additions: list[Addition]) -> HeldBack:
        """Read the keys of `additions` and plan the deletes of the rows they replace, on
        `table` as it is now; returns the additions that cannot go in with this commit (the
        others' deletes are planned)."""
        keys = self.key_indexes.read_keys(
            table, [(addition.data_files, addition.deleted_keys) for addition in additions]
        )
        held = HeldBack()
        readable: list[MonikerKeys] = []
        for addition, found in zip(additions, keys):
            delivery = addition.delivery
            writer = delivery.moniker.writer_id if delivery.moniker is not None else None
            if isinstance(found, InvalidFile):
                held.quarantined.append((delivery, str(found)))
            elif isinstance(found, FileUnavailable) or writer in held.writers:
                if writer is not None:
                    held.writers.setdefault(writer, delivery.moniker.seq)
                held.waiting.append(delivery)
                if isinstance(found, FileUnavailable):
                    held.unavailable.append((delivery, str(found)))
            else:
                readable.append(found)
        self._cycle = self.key_indexes.plan(table, readable) if readable else None
        return held

    def add_to(self, changes: SnapshotChanges) -> None:
        """The planned deletes into the snapshot: new delete files in, the live ones they take
        over out."""
        if self._cycle is None:
            return
        removed = self._cycle.removed_deletes
        changes.delete_files = list(self._cycle.delete_files)
        changes.removed_files = [live.delete_file for live in removed]
        changes.removed_from = {live.manifest_path for live in removed}

    def committed(self, snapshot_id: int, table: Table, outcome: TableCommit) -> None:
        """The commit is durable: the index follows it."""
        if self._cycle is None:
            return
        self.key_indexes.committed(self._cycle, snapshot_id, table)
        outcome.rows_replaced = self._cycle.rows_replaced
