"""Heartbeats: a snapshot with no files that carries a table's committed state forward.

Schedulers that wait on a table's watermark (seed 004) read it from the newest snapshot; a table
whose sources went quiet would look stalled. Every `bookkeeper.heartbeat_every_empty_cycles`
cycles without a commit, the service commits one of these: the same state, a new commit id,
this bookkeeper's epoch, and a commit report line.
"""

from __future__ import annotations

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from icekeeper.bookkeeper.commit_path import SnapshotChanges, SnapshotProducer, TableCommit
from icekeeper.common.committed_state import CommittedState


class Heartbeat(SnapshotProducer):
    """An empty snapshot on table `identifier` (which must exist)."""

    what = "heartbeat"

    def __init__(self, identifier: str) -> None:
        self.identifier = identifier

    def plan(
        self, table: Table | None, state: CommittedState, outcome: TableCommit
    ) -> SnapshotChanges | None:
        if table is None:
            raise NoSuchTableError(f"{self.identifier}: no such table to send a heartbeat to")
        return SnapshotChanges(table=table, state=state)
