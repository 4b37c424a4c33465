"""Event Grid files: Parquet files other tools wrote into a table's location, committed without a
moniker.

Azure Event Grid announces each blob created (`common/file_events.py`); the service finds the
table whose location holds it, and this producer commits the table's new files as one snapshot.
The table must exist and be unpartitioned (an event carries no partition values), and the files
must carry Iceberg field ids from the table's schema; others are quarantined with the reason. On
an upsert table the files replace the rows of their keys too (`row_delta.py`).

Exactly once by file: the keys of files committed this way travel in the snapshot summary (the
newest `EVENT_FILES_KEPT`), and a redelivered event for one of them is acknowledged without
committing it again. Events for files icekeeper's roles write themselves (a writer's batch folder,
the bookkeeper's deletes, the reaper's compactions: `locations.is_written_by_icekeeper`), which
Event Grid announces like any other blob, are acknowledged without a commit: those files reach the
table with their moniker or rewrite request.
"""

from __future__ import annotations

import dataclasses

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from icekeeper.bookkeeper.commit_path import SnapshotChanges, SnapshotProducer, TableCommit
from icekeeper.bookkeeper.datafiles import FileUnavailable, FooterReader, InvalidFile, data_file
from icekeeper.bookkeeper.row_delta import Addition, RowDelta
from icekeeper.bookkeeper.table_key_indexes import TableKeyIndexes
from icekeeper.common.committed_state import CommittedState
from icekeeper.common.file_events import location_key
from icekeeper.common.locations import is_written_by_icekeeper
from icekeeper.common.moniker import FileEntry
from icekeeper.common.transports.base import Delivery

EVENT_FILES_KEPT = 2000
"""Event Grid file keys kept in the committed state: redeliveries come within minutes, not days."""


class EventGridFiles(SnapshotProducer):
    """Commits the files announced by `deliveries` (one table's file events) as one snapshot."""

    what = "commit of file events"

    def __init__(
        self,
        identifier: str,
        deliveries: list[Delivery],
        footer_reader: FooterReader,
        key_indexes: TableKeyIndexes | None,
    ) -> None:
        """`key_indexes` is given for an upsert table (its row delta)."""
        self.identifier = identifier
        self.deliveries = deliveries
        self.footer_reader = footer_reader
        self.key_indexes = key_indexes
        self.row_delta: RowDelta | None = None
        """This attempt's row delta (a new one each attempt: a lost swap plans it again)."""
        self._committed: list[Delivery] = []

    def plan(
        self, table: Table | None, state: CommittedState, outcome: TableCommit
    ) -> SnapshotChanges | None:
        identifier = self.identifier
        self.row_delta = RowDelta(self.key_indexes) if self.key_indexes is not None else None
        self._committed = []
        if table is None:
            raise NoSuchTableError(f"{identifier}: no such table for its file events")
        done = set(state.event_files)
        fresh, seen = [], set()
        for delivery in self.deliveries:
            key = delivery.file_event.container_path
            own = is_written_by_icekeeper(
                event_file_path(delivery.file_event.url, table.location()), table.location()
            )
            if own or key in done or key in seen:
                # A file of icekeeper's own (a writer's, with its moniker) reaches the table
                # through its own path: committed from the event too, its rows would be twice.
                outcome.duplicates.append(delivery)
            else:
                seen.add(key)
                fresh.append(delivery)
        if not fresh:
            return None
        if table.spec().fields:
            outcome.quarantined = [
                (d, f"{identifier} is partitioned; files need a moniker with partition values")
                for d in fresh
            ]
            fresh = []
        additions = self._additions(table, fresh, outcome)
        if additions and self.row_delta is not None:
            # Files written by others into an upsert table replace the rows of their keys too.
            held = self.row_delta.plan(table, additions)
            gone = held.deliveries()
            additions = [a for a in additions if id(a.delivery) not in gone]
            outcome.waiting.extend(held.waiting)
            outcome.unavailable.extend(held.unavailable)
            outcome.quarantined.extend(held.quarantined)
        if not additions and not outcome.quarantined:
            return None
        self._committed = [addition.delivery for addition in additions]
        data_files = [data for addition in additions for data in addition.data_files]
        keys = [d.file_event.container_path for d in self._committed]
        changes = SnapshotChanges(
            table=table,
            state=dataclasses.replace(
                state, event_files=(list(state.event_files) + keys)[-EVENT_FILES_KEPT:]
            ),
            data_files=data_files,
        )
        if self.row_delta is not None:
            self.row_delta.add_to(changes)
        outcome.records = sum(f.record_count for f in data_files)
        outcome.bytes = sum(f.file_size_in_bytes for f in data_files)
        return changes

    def committed(self, changes: SnapshotChanges, snapshot_id: int, outcome: TableCommit) -> None:
        if self.row_delta is not None:
            self.row_delta.committed(snapshot_id, changes.table, outcome)
        outcome.committed = list(self._committed)
        outcome.files = len(changes.data_files)

    def _additions(
        self, table: Table, fresh: list[Delivery], outcome: TableCommit
    ) -> list[Addition]:
        """The files of `fresh` events that can be committed, read and checked against the
        table; the others quarantined (not what the table takes) or waiting (storage cannot
        serve them now: the queue delivers the event again after its visibility timeout)."""
        schema = table.schema()
        schema_json = schema.model_dump_json()
        paths = [event_file_path(d.file_event.url, table.location()) for d in fresh]
        facts = self.footer_reader.describe(
            [(path, schema, schema_json) for path in paths], table.properties
        )
        additions = []
        for delivery, path in zip(fresh, paths):
            described = facts[path]
            if isinstance(described, FileUnavailable):
                outcome.waiting.append(delivery)
                outcome.unavailable.append((delivery, str(described)))
                continue
            problem = described if isinstance(described, InvalidFile) else None
            if problem is None and delivery.file_event.size_bytes not in (
                None,
                described.size_bytes,
            ):
                problem = InvalidFile(
                    f"{path}: {described.size_bytes} bytes, "
                    f"the event says {delivery.file_event.size_bytes}"
                )
            if problem is None and not described.field_ids:
                problem = InvalidFile(
                    f"{path}: no Iceberg field ids in the Parquet schema "
                    "(write it with the table's schema)"
                )
            if problem is None and described.field_ids - schema.field_ids:
                problem = InvalidFile(
                    f"{path}: field ids {sorted(described.field_ids - schema.field_ids)} "
                    "are not in the table's schema"
                )
            if problem is not None:
                outcome.quarantined.append((delivery, str(problem)))
                continue
            entry = FileEntry(
                path=path, size_bytes=described.size_bytes, record_count=described.num_rows
            )
            additions.append(Addition(delivery, [data_file(entry, described, table.spec())]))
        return additions


def event_file_path(url: str, table_location: str) -> str:
    """The path pyarrow opens for an event's URL: local test files keep their path; storage URLs
    are rewritten onto the table location's scheme (abfs[s]://container@account...)."""
    if url.startswith(("file:", "/")):
        return url if url.startswith("file:") else "file://" + url
    table_key, file_key = location_key(table_location), location_key(url)
    if file_key.startswith(table_key + "/"):
        return table_location.rstrip("/") + file_key[len(table_key) :]
    return url
