"""Commit the reaper's compactions of upsert tables (see `common/rewrites.py` for the hand-off).

The reaper cannot commit a compaction of a table the bookkeeper keeps updating: every cycle adds
position deletes to the files it compacts. So the bookkeeper commits it, between its own cycles,
as one `replace` snapshot: the compacted files in, the replaced data files and the delete files
that only concern them out, and position deletes for the rows of the compacted files whose keys
were updated or deleted after the compaction read them. The key index says which those are and
learns where the live rows went (`UpsertKeeper.plan_rewrite`).

Exactly once: the snapshot names the request (`icekeeper.rewrite-id`); a request found committed
is only dropped. A request that cannot be committed (its files changed, every replaced file is
gone after a concurrent rewrite, a gone one still holds live rows by the index, as after
retention, a live row would be lost) is refused with the reason; the reaper reads the refusal and
deletes its files. Replaced files gone with no live row left (the bookkeeper purged them,
`purges.py`, while the reaper wrote) are let go: their rows in the new files are stale. The
bookkeeper's own requests (its purges) go the same way, and a refused one's files are deleted here.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.update import AssertTableUUID

from bookkeeper.committer import CommitConflict, Committer, TableCommit, attempt_until_committed
from bookkeeper.datafiles import FileUnavailable, InvalidFile, data_file, validate
from bookkeeper.manifests import rewrite_files
from bookkeeper.upserts import RewriteCycle, RewriteRefused, live_files
from common.catalog import load_table_or_none
from common.delete_files import referenced_data_files
from common.internals import UncopiedTransaction, commit_once
from common.rewrites import (
    REWRITE_ID_PROPERTY,
    REWRITE_ORIGIN_PROPERTY,
    RewriteRequest,
    discard_rewrite,
    finish_rewrite,
    pending_rewrites,
    refuse_rewrite,
)

log = logging.getLogger(__name__)


class RewriteCommitter:
    """Commits pending rewrite requests of upsert tables, one snapshot per request."""

    def __init__(self, committer: Committer) -> None:
        # The committer's catalog, footer readers, key
        # indexes and epoch (set when the lease is taken).
        self.committer = committer
        self.catalog = committer.catalog

    def commit_pending(self, identifier: str) -> list[TableCommit]:
        """Commit (or refuse) every request waiting for table `identifier`; returns the reaper's
        (a purge a bookkeeper left behind when it died is committed, not returned)."""
        table = load_table_or_none(self.catalog, identifier)
        if table is None:
            return []
        results = []
        for request in pending_rewrites(table.location()):
            if isinstance(request, tuple):
                request_id, reason = request
                refuse_rewrite(table.location(), request_id, reason)
                log.warning(
                    "rewrite request refused",
                    extra={"table": identifier, "request": request_id, "reason": reason},
                )
                continue
            result = self.commit(identifier, request)
            if request.origin == "reaper":  # a purge is no news to report (`purges.py`)
                results.append(result)
        return results

    def commit(self, identifier: str, request: RewriteRequest) -> TableCommit:
        """Commit one request, or refuse it with the reason; never both, never twice."""
        return attempt_until_committed(
            identifier,
            lambda attempt: self._attempt(identifier, request, attempt),
            f"rewrite {request.id}",
        )

    def _attempt(self, identifier: str, request: RewriteRequest, attempt: int) -> TableCommit:
        """One attempt at `commit`, on the table as it is now; `CommitConflict` if it lost."""
        table = self.catalog.load_table(identifier)
        state = self.committer.checked_state(identifier, table)
        result = TableCommit(identifier, attempts=attempt)
        if _committed_before(table, request.id):
            finish_rewrite(table.location(), request.id)
            return result
        try:
            removed, added, cycle = self._plan(table, request)
        except (RewriteRefused, InvalidFile) as error:
            if request.origin == "bookkeeper":
                discard_rewrite(table.location(), request)  # nobody waits for a refusal
            else:
                refuse_rewrite(table.location(), request.id, str(error))
            log.warning(
                "rewrite request refused",
                extra={
                    "table": identifier,
                    "request": request.id,
                    "origin": request.origin,
                    "reason": str(error),
                },
            )
            result.refusal = str(error)
            return result
        new_state = dataclasses.replace(
            state, commit_id=uuid.uuid4().hex, epoch=max(self.committer.epoch, state.epoch)
        )
        properties = {
            **new_state.to_summary([]),
            REWRITE_ID_PROPERTY: request.id,
            REWRITE_ORIGIN_PROPERTY: request.origin,
        }
        transaction = UncopiedTransaction(table)
        with rewrite_files(transaction, properties, removed, cycle.delete_files) as producer:
            for data in added:
                producer.append_data_file(data)
        try:  # one compare-and-swap, as the committer's
            commit_once(transaction, (AssertTableUUID(uuid=table.metadata.table_uuid),))
        except CommitFailedException as error:
            raise CommitConflict(str(error)) from error  # planned again on the refreshed table
        snapshot_id = table.current_snapshot().snapshot_id
        self.committer.upserts.rewritten(cycle, snapshot_id, table)
        finish_rewrite(table.location(), request.id)
        # A purge says what it did in its own line (`purges.py`); the reaper's compactions here.
        log.log(
            logging.DEBUG if request.origin == "bookkeeper" else logging.INFO,
            "rewrite committed",
            extra={
                "table": identifier,
                "request": request.id,
                "snapshot_id": snapshot_id,
                "files_replaced": len(request.replaced),
                "files_added": len(added),
                "rows_moved": cycle.rows_moved,
                "rows_stale": cycle.rows_stale,
            },
        )
        result.snapshot_id, result.files, result.rows_replaced = (
            snapshot_id,
            len(added),
            cycle.rows_stale,
        )
        result.records = sum(data.record_count for data in added)
        return result

    def _plan(
        self, table: Table, request: RewriteRequest
    ) -> tuple[list[DataFile], list[DataFile], RewriteCycle]:
        """(files to remove, data files to add, the key index's plan) for `request` on `table` as
        it is now."""
        live_data, delete_files = live_files(table, table.current_snapshot())
        data_files = {data.file_path: data for data in live_data}
        gone = [path for path in request.replaced if path not in data_files]
        still_live = self.committer.upserts.live_rows_in(table, gone) if gone else 0
        if gone and (len(gone) == len(request.replaced) or still_live):
            raise RewriteRefused(
                f"{len(gone)} of {len(request.replaced)} replaced files are no longer in the table "
                f"(another rewrite or retention; {still_live} live rows in them by the key "
                f"index), e.g. {gone[0]}"
            )
        schema = Schema.model_validate(request.schema_)
        schema_json = schema.model_dump_json()
        facts = self.committer.footer_reader.describe(
            [(entry.path, schema, schema_json) for entry in request.files], table.properties
        )
        added = []
        for entry in request.files:
            described = facts[entry.path]
            if isinstance(described, (InvalidFile, FileUnavailable)):
                # unavailable: not refused, the request stays pending for the next poll
                raise described
            validate(entry, described, table.location(), schema)
            added.append(
                data_file(entry, described, table.specs().get(entry.spec_id, table.spec()))
            )
        # Files gone with no live row left: the bookkeeper's purge copied their rows elsewhere
        # while the reaper wrote. Their rows in the new files are stale (their keys live in the
        # purge's files), deleted again like rows updated meanwhile; the rest of the compaction
        # lands, which under steady updates it otherwise never would.
        replaced = set(request.replaced) - set(gone)
        cycle = self.committer.upserts.plan_rewrite(table, added, replaced)
        removed = [data_files[path] for path in request.replaced if path in replaced]
        removed += _deletes_only_for(delete_files, replaced)
        return removed, added, cycle


def _committed_before(table: Table, request_id: str) -> bool:
    return any(
        snapshot.summary is not None
        and snapshot.summary.additional_properties.get(REWRITE_ID_PROPERTY) == request_id
        for snapshot in table.snapshots()
    )


def _deletes_only_for(delete_files: list[DataFile], replaced: set[str]) -> list[DataFile]:
    """Delete files every entry of which points into `replaced` data files: they leave with them."""
    return [
        delete_file
        for delete_file in delete_files
        if (targets := referenced_data_files(delete_file)) and targets <= replaced
    ]
