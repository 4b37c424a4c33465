"""Commit the reaper's compactions of upsert tables (see `common/rewrites.py` for the hand-off).

The reaper cannot commit a compaction of a table the bookkeeper keeps updating: every cycle adds
position deletes to the files it compacts. So the bookkeeper commits it, between its own cycles,
as one `replace` snapshot: the compacted files in, the replaced data files and the delete files
that only concern them out, and position deletes for the rows of the compacted files whose keys
were updated or deleted after the compaction read them. The key index says which those are and
learns where the live rows went (`TableKeyIndexes.plan_rewrite`). Each request is one
`RewriteReplace` producer on the commit path (`commit_path.py`).

Exactly once: the snapshot names the request (`icekeeper.rewrite-id`); a request found committed
is only dropped. Found committed also once that snapshot has expired: when a file of the request
is in the current snapshot (only its commit adds them). A request that cannot be committed (its
files changed, every replaced file is gone after a concurrent rewrite, a gone one still holds live
rows by the index, as after retention, a live row would be lost) is refused with the reason; the
reaper reads the refusal and deletes its files. Replaced files gone with no live row left (the
bookkeeper purged them, `purges.py`, while the reaper wrote) are let go: their rows in the new files
are stale. The bookkeeper's own requests (its purges) go the same way, and a refused one's files
are deleted here. Unless a commit of the request was attempted before (`mark_commit_attempt`,
written before every commit): then it may have landed in a snapshot expired since, and the files
are left to orphan removal, which knows whether any snapshot still names them.

One request never holds up the others: each is tried on its own, and one that fails (storage or
the catalog cannot serve it now, conflicts) stays pending for the next poll while the queue goes
on. A request whose files storage says do not exist for `bookkeeper.missing_file_timeout`, that
is not a readable request, or that failed `bookkeeper.rewrite_failed_polls` polls with an error
that is not an outage (`outages.py`), is set aside with the reason (`set_aside_rewrite`), files
kept, for the operator; an outage never sets one aside.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from icekeeper.bookkeeper.commit_path import (
    CommitPath,
    SnapshotChanges,
    SnapshotProducer,
    StaleEpoch,
    TableCommit,
)
from icekeeper.bookkeeper.datafiles import (
    FileUnavailable,
    FooterReader,
    InvalidFile,
    data_file,
    validate,
)
from icekeeper.bookkeeper.missing_files import MissingSince
from icekeeper.bookkeeper.outages import is_outage
from icekeeper.bookkeeper.table_key_indexes import (
    RewriteCycle,
    RewriteRefused,
    TableKeyIndexes,
    live_files,
)
from icekeeper.common.committed_state import CommittedState
from icekeeper.common.delete_files import referenced_data_files
from icekeeper.common.locations import normalize_location
from icekeeper.common.rewrites import (
    REWRITE_ID_PROPERTY,
    REWRITE_ORIGIN_PROPERTY,
    RewriteRequest,
    UnreadableRewrite,
    clear_commit_attempt,
    commit_attempted,
    discard_rewrite,
    finish_rewrite,
    mark_commit_attempt,
    pending_rewrites,
    refuse_rewrite,
    set_aside_rewrite,
)

log = logging.getLogger(__name__)


@dataclass
class PendingRewrites:
    """What one poll of a table's rewrite requests did, request by request."""

    committed: list[TableCommit] = field(default_factory=list)
    """The reaper's requests committed (or found committed) and refused; purges are not news."""
    set_aside: list[tuple[str, str]] = field(default_factory=list)
    """(request id, reason) of the requests set aside."""
    failed: list[tuple[str, str]] = field(default_factory=list)
    """(request id, error) of the requests left pending for the next poll."""


class RewriteCommitter:
    """Commits pending rewrite requests of upsert tables, one snapshot per request."""

    def __init__(
        self,
        catalog: Catalog,
        commit_path: CommitPath,
        footer_reader: FooterReader,
        key_indexes: TableKeyIndexes,
        missing_file_timeout: float,
        failed_polls: int,
    ) -> None:
        """`failed_polls`: polls a request may fail with an error that is not an outage before
        it is set aside (`bookkeeper.rewrite_failed_polls`)."""
        self.catalog = catalog
        self.commit_path = commit_path
        self.footer_reader = footer_reader
        self.key_indexes = key_indexes
        self.missing_file_timeout = missing_file_timeout
        self.failed_polls = failed_polls
        self._missing = MissingSince()
        """Per request id, since when storage has said one of its files does not exist;
        forgotten once the request is read whole, committed, refused or set aside."""
        self._failures: dict[str, int] = {}
        """Per request id, the polls it failed with an error that is not an outage; forgotten
        once it is committed, refused or set aside."""

    def commit_pending(self, identifier: str) -> PendingRewrites:
        """Commit (or refuse, or set aside) every request waiting for table `identifier`, each on
        its own: one that fails stays pending and the next is tried. Raises only what concerns
        the table (it cannot be loaded, its requests cannot be listed) and `StaleEpoch`."""
        outcome = PendingRewrites()
        table = self.commit_path.current_table(identifier)  # for its location
        if table is None:
            return outcome
        location = table.location()
        for request in pending_rewrites(location):
            if isinstance(request, UnreadableRewrite):
                if request.content is None:  # storage did not serve it: an outage, not a verdict
                    _left_pending(identifier, request.request_id, request.reason, outcome)
                    continue
                try:
                    set_aside_rewrite(
                        location, request.request_id, request.reason, content=request.content
                    )
                except OSError as error:
                    _left_pending(identifier, request.request_id, repr(error), outcome)
                    continue
                self._missing.forget(request.request_id)
                _log_set_aside(identifier, location, request.request_id, request.reason)
                outcome.set_aside.append((request.request_id, request.reason))
                continue
            try:
                result = self.commit(identifier, request)
            except StaleEpoch:
                raise
            except Exception as error:  # noqa: BLE001 - this request waits; the others go on
                self._failed(identifier, location, request, error, outcome)
                continue
            self._failures.pop(request.id, None)
            if result.set_aside is not None:
                outcome.set_aside.append((request.id, result.set_aside))
            elif request.origin == "reaper":  # a purge is no news to report (`purges.py`)
                outcome.committed.append(result)
        return outcome

    def _failed(
        self,
        identifier: str,
        location: str,
        request: RewriteRequest,
        error: Exception,
        outcome: PendingRewrites,
    ) -> None:
        """A poll of `request` failed: it stays pending, unless the error is no outage and it
        has failed so `failed_polls` times; then it is set aside with the reason, for the
        operator (tried again every poll, a request that no commit can take would fail for
        ever). An outage is never counted: it says nothing about the request."""
        if is_outage(error):
            _left_pending(identifier, request.id, repr(error), outcome)
            return
        failures = self._failures.get(request.id, 0) + 1
        if failures < self.failed_polls:
            self._failures[request.id] = failures
            _left_pending(identifier, request.id, repr(error), outcome)
            return
        reason = (
            f"failed {failures} polls (bookkeeper.rewrite_failed_polls {self.failed_polls}) "
            f"with an error that is not an outage; the last: {error!r}"
        )
        try:
            set_aside_rewrite(location, request.id, reason, request=request)
        except OSError as unreachable:  # storage: set aside at a later poll
            _left_pending(identifier, request.id, repr(unreachable), outcome)
            return
        self._failures.pop(request.id, None)
        self._missing.forget(request.id)
        _log_set_aside(identifier, location, request.id, reason)
        outcome.set_aside.append((request.id, reason))

    def commit(self, identifier: str, request: RewriteRequest) -> TableCommit:
        """Commit one request, or refuse it with the reason, or set it aside; never two of them,
        never twice. Raises when it cannot tell now (storage, the catalog, conflicts): the request
        stays pending."""
        return self.commit_path.commit(
            identifier,
            RewriteReplace(
                identifier,
                request,
                self.footer_reader,
                self.key_indexes,
                self._missing,
                self.missing_file_timeout,
            ),
        )


class RewriteReplace(SnapshotProducer):
    """One rewrite request as a `replace` snapshot: its files in, the files it replaces out, and
    position deletes for its rows whose keys changed since it was written."""

    def __init__(
        self,
        identifier: str,
        request: RewriteRequest,
        footer_reader: FooterReader,
        key_indexes: TableKeyIndexes,
        missing: MissingSince,
        missing_file_timeout: float,
    ) -> None:
        """`missing`: since when the bookkeeper has found files of its requests missing."""
        self.identifier = identifier
        self.request = request
        self.what = f"rewrite {request.id}"
        self.footer_reader = footer_reader
        self.key_indexes = key_indexes
        self.missing = missing
        self.missing_file_timeout = missing_file_timeout
        self._cycle: RewriteCycle | None = None

    def plan(
        self, table: Table | None, state: CommittedState, outcome: TableCommit
    ) -> SnapshotChanges | None:
        """The request's snapshot on the table as it is now; None when it was committed before,
        or is refused or set aside now (`outcome` says which)."""
        identifier, request = self.identifier, self.request
        if table is None:
            raise NoSuchTableError(f"{identifier}: no such table for rewrite {request.id}")
        location = table.location()
        if _committed_before(table, request.id):
            self.missing.forget(request.id)
            finish_rewrite(location, request.id)
            return None
        live_data, delete_files = live_files(table, table.current_snapshot())
        if _committed_by_its_files(table, request, live_data):
            # Its snapshot expired; its files are the table's now.
            log.info(
                "rewrite request found committed by its files",
                extra={"table": identifier, "request": request.id},
            )
            self.missing.forget(request.id)
            finish_rewrite(location, request.id)
            return None
        try:
            removed, added, cycle = self._planned(table, live_data, delete_files)
        except FileUnavailable as error:
            if not error.missing:
                self.missing.forget(request.id)  # retried for as long as it takes
                raise
            missing_for = self.missing.missing_for(request.id)
            timeout = self.missing_file_timeout
            if missing_for < timeout:
                raise  # not yet for long: it stays pending
            reason = (
                f"files missing for {missing_for:.0f} s (bookkeeper.missing_file_timeout "
                f"{timeout:.0f} s): {error}"
            )
            set_aside_rewrite(location, request.id, reason, request=request)
            self.missing.forget(request.id)
            _log_set_aside(identifier, location, request.id, reason)
            outcome.set_aside = reason
            return None
        except (RewriteRefused, InvalidFile) as error:
            self.missing.forget(request.id)
            attempted = commit_attempted(location, request.id)
            if attempted and request.origin == "bookkeeper":
                finish_rewrite(location, request.id)  # its files: orphan removal's to judge
            elif request.origin == "bookkeeper":
                discard_rewrite(location, request)  # nobody waits for a refusal
            else:
                refuse_rewrite(location, request.id, str(error))
            log.warning(
                "rewrite request refused",
                extra={
                    "table": identifier,
                    "request": request.id,
                    "origin": request.origin,
                    "reason": str(error),
                    "files_kept": attempted,
                },
            )
            outcome.refusal = str(error)
            return None
        self.missing.forget(request.id)
        self._cycle = cycle
        return SnapshotChanges(
            table=table,
            state=state,
            data_files=added,
            delete_files=cycle.delete_files,
            removed_files=removed,
            replace=True,
            expire_snapshots=False,
            properties={
                REWRITE_ID_PROPERTY: request.id,
                REWRITE_ORIGIN_PROPERTY: request.origin,
            },
        )

    def before_swap(self, changes: SnapshotChanges) -> None:
        # Durable before the commit: once the snapshot has expired, this says it may have landed.
        mark_commit_attempt(changes.table.location(), self.request.id)

    def swap_lost(self, changes: SnapshotChanges) -> None:
        clear_commit_attempt(changes.table.location(), self.request.id)  # it did not land

    def committed(self, changes: SnapshotChanges, snapshot_id: int, outcome: TableCommit) -> None:
        request, cycle = self.request, self._cycle
        assert cycle is not None
        self.key_indexes.rewritten(cycle, snapshot_id, changes.table)
        finish_rewrite(changes.table.location(), request.id)
        # A purge says what it did in its own line (`purges.py`); the reaper's compactions here.
        log.log(
            logging.DEBUG if request.origin == "bookkeeper" else logging.INFO,
            "rewrite committed",
            extra={
                "table": self.identifier,
                "request": request.id,
                "snapshot_id": snapshot_id,
                "files_replaced": len(request.replaced),
                "files_added": len(changes.data_files),
                "rows_moved": cycle.rows_moved,
                "rows_stale": cycle.rows_stale,
            },
        )
        outcome.files = len(changes.data_files)
        outcome.rows_replaced = cycle.rows_stale
        outcome.records = sum(data.record_count for data in changes.data_files)

    def _planned(
        self,
        table: Table,
        live_data: list[DataFile],
        delete_files: list[DataFile],
    ) -> tuple[list[DataFile], list[DataFile], RewriteCycle]:
        """(files to remove, data files to add, the key index's plan) for `request` on `table` as
        it is now (`live_data`, `delete_files`: its current snapshot's). `FileUnavailable` (with
        `missing` when storage said a file does not exist) when its files cannot be read now."""
        request = self.request
        data_files = {data.file_path: data for data in live_data}
        gone = [path for path in request.replaced if path not in data_files]
        still_live = self.key_indexes.live_rows_in(table, gone) if gone else 0
        if gone and (len(gone) == len(request.replaced) or still_live):
            raise RewriteRefused(
                f"{len(gone)} of {len(request.replaced)} replaced files are no longer in the table "
                f"(another rewrite or retention; {still_live} live rows in them by the key "
                f"index), e.g. {gone[0]}"
            )
        try:
            schema = Schema.model_validate(request.schema_)
        except ValueError as error:  # pydantic's ValidationError: a request no commit can take
            raise RewriteRefused(f"its schema is not an Iceberg schema: {error}") from None
        schema_json = schema.model_dump_json()
        facts = self.footer_reader.describe(
            [(entry.path, schema, schema_json) for entry in request.files],
            table.properties,
            {entry.path: entry.size_bytes for entry in request.files},
        )
        unavailable = [
            described for described in facts.values() if isinstance(described, FileUnavailable)
        ]
        if unavailable:  # not refused: the request waits (or, missing too long, is set aside)
            raise FileUnavailable(
                "; ".join(str(problem) for problem in unavailable),
                missing=any(problem.missing for problem in unavailable),
            )
        added = []
        for entry in request.files:
            described = facts[entry.path]
            if isinstance(described, InvalidFile):
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
        cycle = self.key_indexes.plan_rewrite(table, added, replaced)
        removed = [data_files[path] for path in request.replaced if path in replaced]
        removed += _deletes_only_for(delete_files, replaced)
        return removed, added, cycle


def _log_set_aside(identifier: str, location: str, request_id: str, reason: str) -> None:
    log.error(
        "rewrite request set aside; its files are kept",
        extra={
            "table": identifier,
            "request": request_id,
            "reason": reason,
            "location": location,
        },
    )


def _left_pending(identifier: str, request_id: str, error: str, outcome: PendingRewrites) -> None:
    outcome.failed.append((request_id, error))
    log.warning(
        "rewrite request left pending; tried again at the next poll",
        extra={"table": identifier, "request": request_id, "error": error},
    )


def _committed_before(table: Table, request_id: str) -> bool:
    return any(
        snapshot.summary is not None
        and snapshot.summary.additional_properties.get(REWRITE_ID_PROPERTY) == request_id
        for snapshot in table.snapshots()
    )


def _committed_by_its_files(
    table: Table, request: RewriteRequest, live_data: list[DataFile]
) -> bool:
    """Whether `request` was committed, known from its files once the snapshot that committed
    it has expired: a file of it is a live data file, and no snapshot left in the table's history
    added it (one that did would name the request that committed it; `_committed_before` found
    none naming this one). Only a request's own commit adds the files of its output folder."""
    wanted = {normalize_location(entry.path) for entry in request.files}
    if not wanted & {normalize_location(data.file_path) for data in live_data}:
        return False
    snapshot = table.current_snapshot()
    added_by = {
        entry.snapshot_id
        for manifest in snapshot.manifests(table.io)
        if manifest.content == ManifestContent.DATA
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        if normalize_location(entry.data_file.file_path) in wanted
    }
    return all(table.snapshot_by_id(snapshot_id) is None for snapshot_id in added_by)


def _deletes_only_for(delete_files: list[DataFile], replaced: set[str]) -> list[DataFile]:
    """Delete files every entry of which points into `replaced` data files: they leave with them."""
    return [
        delete_file
        for delete_file in delete_files
        if (targets := referenced_data_files(delete_file)) and targets <= replaced
    ]
